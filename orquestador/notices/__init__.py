"""Panel notices and their e-mail: writing a notice with its outbox row, preferences, delivery.

The notify adapter writes through `writing`, the API reads through `access` and
`preferences`, and the worker's mailer (`mailer`, started by `worker.background`)
delivers `email_outbox` rows over SMTP (`smtp`) after claiming them (`outbox`).
"""
