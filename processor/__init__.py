"""tokenfabric: schedule LLM inference work by the token over Kafka."""

__version__ = "0.1.0"
