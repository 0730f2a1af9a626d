FROM python:3.11-slim
WORKDIR /srv/poolgate
# auto-login drives Debian's Chromium through Playwright (which cannot download a browser)
RUN apt-get update \
    && apt-get install -y --no-install-recommends chromium \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY app ./app
COPY pool ./pool
COPY sessions ./sessions
COPY auth ./auth
COPY examples/login-recipes ./examples/login-recipes
RUN pip install --no-cache-dir .
EXPOSE 8000
CMD ["poolgate", "serve", "--host", "0.0.0.0", "--port", "8000"]
