"""gunicorn settings of the example: uvicorn workers (asyncio) behind one
gunicorn master. Run from this directory:

    gunicorn -c gunicorn.conf.py app:app
"""
import os

bind = os.environ.get("BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WORKERS", "2"))
worker_class = "uvicorn_worker.UvicornWorker"
# The app module is imported once in the master and the workers fork from
# it (less memory, faster start). That is safe because app.py creates its
# AsyncKnnClient in the ASGI lifespan, which runs in each worker after the
# fork; a client created at import time would be unusable in the workers.
preload_app = True
# Longer than the knnd deadline (KNND_TIMEOUT_S) plus the response.
timeout = 30
graceful_timeout = 10
accesslog = os.environ.get("ACCESS_LOG")  # "-" for stdout
# gunicorn 24+ also opens a control socket under ~/.gunicorn; the example
# needs none, and two instances on one machine would share its path.
# (Older versions ignore the unknown setting.)
control_socket_disable = True
