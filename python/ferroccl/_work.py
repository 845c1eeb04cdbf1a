"""async_op=True: on a blocking communicator, calls run in order on one worker thread
per communicator (the library refuses two threads in one communicator at once, so they
are serialised there, with the communicator's blocking calls); on a non-blocking one the
library runs them on its own progress thread and a Work polls fcclCommGetAsyncError."""

import queue
import threading
import time

from ._lib import FcclError


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

    @classmethod
    def failed(cls, what, error):
        """A Work of a call refused at once (its error comes out of wait())."""
        w = cls(what)
        w._finish(None, error)
        return w

    def __repr__(self):
        state = "running" if not self.is_completed() else ("failed" if self._error else "done")
        return f"<ferroccl.Work {self._what} {state}>"


def poll_until(check, what, timeout):
    """Calls check() until it returns true: at once, then with sleeps that grow to 1 ms
    (the library's progress thread does the work meanwhile). TimeoutError after
    `timeout` seconds (None: no limit)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.0
    while not check():
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not finished after {timeout} s (it is still running)")
        if delay:
            time.sleep(delay)
        delay = min(max(delay * 2, 20e-6), 1e-3)


class Issued(Work):
    """A call on a non-blocking communicator, queued by the library in call order. The
    library reports completion per communicator (fcclCommGetAsyncError), so this Work
    completes when a poll finds the communicator with nothing pending that was issued
    before the poll began: waiting for one call may wait for calls issued after it. An
    error stops the communicator: every call not yet known to be complete gets it."""

    __slots__ = ("_comm", "_seq")

    def __init__(self, comm, seq, what, result):
        super().__init__(what)
        self._comm, self._seq, self._result = comm, seq, result

    def _check(self):
        if self._done.is_set():
            return True
        c = self._comm
        if self._seq > c._settled:
            if c._h is None:
                if c._aborted:
                    self._finish(None, FcclError(self._what, 6, f"{self._what}: the communicator was aborted "
                                                               "(fcclCommAbort) with this call pending"))
                    return True
                c._settled = c._issued  # fcclCommDestroy waited for every call
            else:
                try:
                    if not c._poll():
                        return False
                except FcclError as e:
                    self._finish(None, e)
                    return True
        self._finish(self._result, None)
        return True

    def is_completed(self):
        return self._check()

    def is_success(self):
        return self._check() and self._error is None

    def exception(self):
        self._check()
        return self._error

    def wait(self, timeout=None):
        poll_until(self._check, self._what, timeout)
        if self._error is not None:
            raise self._error
        return self._result


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
