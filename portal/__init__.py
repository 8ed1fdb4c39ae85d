"""The portal: the Django project and its single app. The only package that touches the database."""

# Importing the Celery app here makes `@shared_task` bind to it whenever Django starts.
from portal.celery import app as celery_app

__all__ = ["celery_app"]
