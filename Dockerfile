FROM python:3.11-slim
WORKDIR /srv/poolgate
COPY pyproject.toml README.md ./
COPY app ./app
COPY pool ./pool
COPY sessions ./sessions
COPY auth ./auth
RUN pip install --no-cache-dir .
EXPOSE 8000
CMD ["poolgate", "serve", "--host", "0.0.0.0", "--port", "8000"]
