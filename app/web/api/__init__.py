"""The JSON API under /api, and its OpenAPI document."""
