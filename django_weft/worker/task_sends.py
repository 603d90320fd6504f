"""Sending django_weft's Celery tasks within WEFT_CELERY_SEND_TIMEOUT seconds, whatever the broker does.

With Celery's defaults a send to a broker that accepts the connection and then answers nothing waits
forever on Redis (no socket timeout) and, on RabbitMQ, on any reply it needs on a live connection (a queue
declaration, a publisher confirm); publish retries multiply what does time out. A send that fails is left
to the maintenance pass, so a caller (a web request after its commit) must not wait for one.

The sends go through a kombu producer pool of their own, built from the Celery app's broker settings plus
the knobs that bound each network wait (each checked against a silent peer, see tests/test_celery.py):

* ``connect_timeout``: TCP connect and, for py-amqp, the AMQP handshake; ``max_retries`` and
  ``connect_retries_timeout`` try each broker URL (failover) once;
* ``read_timeout``, ``write_timeout`` (py-amqp): a declaration, a confirm, a write to a full socket;
* ``socket_timeout``, ``socket_connect_timeout`` (Redis): the connection's PING, the LPUSH and its reply;
* ``retry=False``: no publish retries (the maintenance pass is the retry), ``confirm_timeout`` for confirms.

A connection whose send failed is dropped without a closing handshake, which would wait as long again.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kombu import Connection, pools

from django_weft.conf import weft_settings


def publish(task: Any, args: list, options: dict[str, Any]) -> None:
    """``task.apply_async(args=args, **options)`` within WEFT_CELERY_SEND_TIMEOUT seconds; raises what the
    send raised (a kombu ``OperationalError`` for a broker that timed out)."""
    app = task.app
    if app.conf.task_always_eager:  # the task runs here and now: no broker, and it may send tasks itself
        task.apply_async(args=args, **options)
        return
    seconds = float(weft_settings.CELERY_SEND_TIMEOUT)
    broker = repr((app.conf.broker_write_url, app.conf.broker_transport_options))
    pool = pools.producers[_bounded_connection(app, broker, seconds)]
    with pool.acquire(block=True, timeout=seconds) as producer:
        try:
            task.apply_async(args=args, producer=producer, retry=False, confirm_timeout=seconds, **options)
        except Exception:
            _drop(producer.connection)
            raise


@lru_cache(maxsize=16)
def _bounded_connection(app: Any, broker: str, seconds: float) -> Connection:
    """The template of the pool's connections (never connected itself): the app's broker with every wait
    bounded by ``seconds``. ``broker`` (the app's broker settings as text) only keys the cache: a changed
    broker gets a pool of its own."""
    timeouts = {"read_timeout": seconds, "write_timeout": seconds,  # py-amqp
                "socket_timeout": seconds, "socket_connect_timeout": seconds}  # Redis
    connection = app.connection_for_write(connect_timeout=seconds, transport_options=timeouts)
    urls = max(1, len(connection.alt))
    connection.transport_options.update(max_retries=urls - 1, connect_retries_timeout=seconds * urls)
    return connection


def _drop(connection: Connection | None) -> None:
    """Forget a connection that failed a send without talking to the broker: closing its channel and itself
    politely would wait for two more replies that a silent broker never sends."""
    if connection is not None:
        connection.collect()
