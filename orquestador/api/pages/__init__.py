"""The console: server-rendered pages for people, signed in with a cookie, and their forms."""
