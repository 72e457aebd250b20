"""Async load generator for any OpenAI-compatible server (HTTP only: never imports engine or server).

    python -m loadtest --base-url http://127.0.0.1:8000/v1 --concurrency 1,2,4 --requests 8 --out load-report
"""
