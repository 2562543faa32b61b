"""The Django project. Its Celery app (administration/celery_app.py) is the one app every process sends
and runs jobs through: ``celery -A gateway_project worker`` finds it through gateway_project/celery.py,
and a process that sends a job loads it with the jobs' task (administration/tasks.py imports it
first). It is not loaded with the settings: a gateway without a broker never sends a job through
Celery, and importing Celery, kombu and their dependencies was 0.1 s of its start (D118)."""
