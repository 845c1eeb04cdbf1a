"""async_op=True: calls run in order on one worker thread per communicator (the library
refuses two threads in one communicator at once, so they are serialised there, with
the communicator's blocking calls)."""

import queue
import threading


class Work:
    """A call started with ``async_op=True``. ``wait()`` returns its result (the array
    the call returns) or raises its error (an FcclError with the library's message);
    ``is_completed()`` never blocks."""

    __slots__ = ("_done", "_result", "_error", "_what", "__weakref__")

    def __init__(self, what):
        self._done = threading.Event()
        self._result = None
        self._error = None
        self._what = what

    def _finish(self, result, error):
        self._result, self._error = result, error
        self._done.set()

    def is_completed(self):
        """True once the call has finished, successfully or not."""
        return self._done.is_set()

    def is_success(self):
        """True once the call has finished without an error."""
        return self._done.is_set() and self._error is None

    def exception(self):
        """The call's error once finished (None if it succeeded or is still running)."""
        return self._error

    def wait(self, timeout=None):
        """Blocks until the call has finished; returns its result or raises its error.
        With `timeout` (seconds), raises TimeoutError if it has not finished by then
        (the call goes on)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self._what}: not finished after {timeout} s (it is still running)")
        if self._error is not None:
            raise self._error
        return self._result

    def result(self):
        return self.wait()

    def __repr__(self):
        state = "running" if not self._done.is_set() else ("failed" if self._error else "done")
        return f"<ferroccl.Work {self._what} {state}>"


_STOP = object()


class Worker:
    """One thread that runs a communicator's queued calls in order."""

    def __init__(self, name):
        self._q = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, what):
        work = Work(what)
        with self._lock:
            self._pending += 1
        self._q.put((fn, work))
        return work

    def busy(self):
        return self._pending > 0

    def is_current(self):
        """True on the worker thread itself (its calls run directly, in its order)."""
        return threading.current_thread() is self._thread

    def _loop(self):
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            fn, work = item
            try:
                result, error = fn(), None
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                result, error = None, e
            with self._lock:
                self._pending -= 1
            work._finish(result, error)

    def stop(self):
        """Lets queued calls finish, then ends the thread."""
        self._q.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join()
