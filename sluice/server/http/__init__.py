"""The HTTP edge itself: the app (app.py: create_app, app_routes.py, routes.py,
generation_reply.py, info_routes.py, pages.py + static/), its middleware
(middleware.py), errors as responses (errors.py), streamed bodies
(event_stream.py, connection.py), and the process (launch.py, shutdown.py).
Imports nothing of its package."""
