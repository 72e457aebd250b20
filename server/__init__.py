"""dspark-serve HTTP layer: the OpenAI-compatible FastAPI app over `engine.api` / `engine.client`."""
