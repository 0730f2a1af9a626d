"""``cli`` workers: vendor coding CLIs (Claude Code, Codex, Qwen Code, JSON-RPC
agents) as supervised subprocess workers, one account each.

- :mod:`pool.cli.events`: the neutral events drivers yield and their inputs;
- :mod:`pool.cli.driver`: the driver interface (read its docstring to write one);
- :mod:`pool.cli.registry`: ``cli`` name → driver;
- :mod:`pool.cli.worker`: the gateway's side (a supervised ``python -m pool.cli``);
- :mod:`pool.cli.host`: the child's side, shared by every driver.
"""

from .driver import CliDriver, Conversation, DriverConfig, DriverError
from .registry import CLIS, DRIVERS, make_driver

__all__ = ["CliDriver", "Conversation", "DriverConfig", "DriverError", "CLIS", "DRIVERS",
           "make_driver"]
