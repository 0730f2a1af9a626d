"""How a Qwen Code process is started: which program, which tools are off.

From 0.24 the npm package's ``qwen`` is a launcher (``cli-entry.js``) that
runs the real CLI as a *child* (``node --expose-gc cli.js …``), whatever
``QWEN_CODE_NO_RELAUNCH`` says (seen on 0.24.4). Killing the launcher (how an
interrupt ends a Qwen turn) would leave that child running its turn and
holding the upstream connection, out of reach of the parent-death signal. So
the driver starts ``cli.js`` itself, the way the launcher would; 0.15's
``qwen`` is ``cli.js`` already and is run as it is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["CHAT_EXCLUDED_TOOLS", "direct_command"]

#: every built-in tool of Qwen Code 0.15.x and 0.24.x (unknown names are ignored by the CLI)
CHAT_EXCLUDED_TOOLS = (
    "tool_search", "agent", "task", "task_stop", "send_message", "skill", "list_directory",
    "read_file", "read_many_files", "grep_search", "glob", "edit", "write_file",
    "run_shell_command", "todo_write", "ask_user_question", "web_fetch", "web_search",
    "monitor", "save_memory", "exit_plan_mode", "lsp",
    # new in 0.24
    "exec", "zoom_image", "enter_plan_mode", "image_gen", "cron_create", "cron_list",
    "cron_delete", "loop_wakeup", "create_sub_session", "list_agents", "task_create",
    "task_update", "task_list", "team_create", "team_delete", "team_plan_approval",
    "request_shutdown", "notebook_edit", "tool_call", "read_mcp_resource", "enter_worktree",
    "exit_worktree", "workflow", "artifact", "record_artifact", "record_source",
    "report_findings", "get_goal", "update_goal", "omni_downsample_image",
    "omni_downscale_video", "omni_downsample_audio", "omni_extract_keyframes",
    "omni_extract_audio", "omni_clip_video", "omni_convert_image", "omni_transcribe_audio",
    "omni_clip_image", "omni_clip_audio", "omni_caption_image", "omni_caption_audio",
    "omni_ocr_image", "omni_understand_video_segments",
)


def direct_command(command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``command`` with the 0.24 launcher replaced by ``node --expose-gc cli.js``."""
    command = list(command)
    found = shutil.which(command[0], path=env.get("PATH")) if os.sep not in command[0] \
        else command[0]
    if found is None:
        return command
    real = Path(found).resolve()
    cli = real.with_name("cli.js")
    if real.name != "cli-entry.js" or not cli.is_file():
        return command
    node = shutil.which("node", path=env.get("PATH"))
    if node is None:
        return command
    return [node, "--expose-gc", str(cli), *command[1:]]
