# The gateway image. Triton itself runs elsewhere; the `sim` extra is only for `gateway demo`.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY gateway ./gateway
COPY lua ./lua
COPY config ./config
RUN pip install --no-cache-dir '.[sim]'

# uid 10001: the Kubernetes manifests run the pod as this user (deploy/kubernetes).
RUN useradd --uid 10001 --create-home gateway
USER gateway
# The API on 8080; /metrics and /admin/* only on the ops listener, 8081, which the
# deployment keeps from the API's clients (config/gateway.yaml: server.ops).
ENV GATEWAY_OPS_HOST=0.0.0.0
EXPOSE 8080 8081
ENTRYPOINT ["gateway"]
CMD ["serve", "--config", "config/gateway.yaml", "--host", "0.0.0.0", "--port", "8080"]
