"""OpenAI's Responses API (`POST /v1/responses`, stateless) as an adapter over the chat pipeline.

`protocol` holds the request model and the documented shapes, `convert` turns a request into a
`ChatCompletionRequest`, and `format` turns the chat formatter's chunks into Responses events and
objects: a response is generated exactly as the equivalent chat completion would be.
"""
