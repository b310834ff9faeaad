# agent-gateway as a container image. Written for Docker/Podman but not run on the machine it was
# written on (no container runtime there): tests/test_deploy.py checks the files it copies and
# the command it runs, not a build.
#
#   docker build -t agent-gateway .
#   AGENT_GATEWAY_TOKEN=... docker compose up -d        # see compose.yaml
FROM python:3.11-slim-bookworm

# Node.js, for the example's npm upstreams (npx fetches them on first start); tini, PID 1.
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs npm tini \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# The versions CI tested (constraints.txt, written by scripts/lock).
COPY pyproject.toml constraints.txt README.md LICENSE ./
COPY src ./src
RUN pip install --no-cache-dir -c constraints.txt .
COPY docker/gateway.yaml /etc/agent-gateway/gateway.yaml

RUN useradd --create-home --uid 10001 gateway && mkdir -p /data && chown gateway /data
USER gateway
VOLUME ["/data"]
EXPOSE 8000
# /healthz answers from the start (starting.py): the start period only covers the imports.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
# tini as PID 1 reaps what an upstream's own children leave (npm's, a server's helper): orphans
# come to PID 1, and the gateway, which waits only for the processes it started, left each a
# zombie (one per restart or reload of such an upstream). It passes every signal on.
ENTRYPOINT ["tini", "--", "agent-gateway"]
CMD ["serve", "-c", "/etc/agent-gateway/gateway.yaml"]
