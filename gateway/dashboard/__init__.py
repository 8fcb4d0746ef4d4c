"""The web dashboard (issue #41): server-rendered pages over the store every gateway shares.

`agent-cli-gateway dashboard` serves it on its own listener; `serve --transport http` also
serves it at `/ui`. Layout: `guard.py` (Host/Origin, security headers), `auth.py` (the
one-time token traded for a session cookie, CSRF), `app.py` (the routes), `views.py` (rows
as a page shows them), `live.py` (the server-sent event streams), `charts.py` (SVG),
`templates/` (Jinja2, autoescaped) and `static/` (the one script and the stylesheet: the
Content-Security-Policy allows no inline script or style).
"""
