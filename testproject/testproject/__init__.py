# The Celery app is loaded with Django so that shared tasks bind to it; Celery is optional for the demo.
try:
    from .celery import app as celery_app
except ImportError:  # pragma: no cover - installed without the celery extra
    celery_app = None

__all__ = ["celery_app"]
