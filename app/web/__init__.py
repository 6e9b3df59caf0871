"""The web side: the JSON API, the operator dashboard, and the HTTP server that serves them."""
