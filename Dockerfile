# The tokenfabric image: every command (processor, consumer, produce, status, ...) from one entry point.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY processor ./processor
COPY data ./data
RUN pip install --no-cache-dir . && useradd --system --uid 10001 tokenfabric
ENV TOKENFABRIC_TRACES=/app/data/traces
USER 10001
ENTRYPOINT ["tokenfabric"]
CMD ["--help"]
