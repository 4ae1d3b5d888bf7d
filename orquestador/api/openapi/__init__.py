"""The OpenAPI 3.1 document and its parts, one module per area of the API."""
