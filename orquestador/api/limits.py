"""The request head the API accepts: gunicorn enforces it, and the app checks the same.

Kept apart from the app so that serving code (orquestador.serve, gunicorn.conf.py) can
read the limits without importing the app, its routes and, through them, the metrics:
under gunicorn those must first be imported in a worker, once the multiprocess metrics
directory is ready.
"""

MAX_REQUEST_LINE_BYTES = 4094
MAX_HEADER_FIELDS = 100
MAX_HEADER_FIELD_BYTES = 8190  # one "Name: value" line with its CRLF, as gunicorn counts
