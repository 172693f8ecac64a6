"""compile=True: the Trainer's forward-and-loss region and feed stages under torch.compile, and
the lock that keeps compilation (which is not thread-safe) on one lane thread at a time."""
import threading
import types

import torch


# torch.compile is not thread-safe: compilation (a compiled function's first calls) happens on
# one thread at a time, whichever lane thread reaches it first.
_COMPILE_LOCK = threading.RLock()


def _own_code(fn):
    """`fn` with a code object of its own. Dynamo keeps its compiled variants per code object,
    up to a recompile limit (8) past which it runs the function eagerly without a word: every
    compiled copy (mode auto's trials, benchmark()) gets its own cache so none counts against
    another's."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


def _serialized(fn, first_calls=3):
    """`fn` whose first calls (where torch.compile traces, compiles and autotunes) hold the
    compile lock; later calls run freely."""
    calls = [0]

    def call(*args):
        if calls[0] < first_calls:
            with _COMPILE_LOCK:
                calls[0] += 1
                return fn(*args)
        return fn(*args)
    return call


def _identity(x):
    return x


_DYNAMO_PRIMED = False


def _prime_dynamo():
    """Compiles a trivial function once on the calling thread (the user's, long-lived). In
    torch 2.11, when a process's first torch.compile compilation happens on a thread that then
    ends (a run's lane thread), the next compilation on any other thread crashes the process
    (a segmentation fault in FakeTensorMode.__enter__); a first compilation on a thread that
    lives on prevents it. tandem compiles on its lane threads, so it primes first."""
    global _DYNAMO_PRIMED
    if not _DYNAMO_PRIMED:
        torch.compile(lambda x: x + 1, backend="eager")(torch.zeros(1))
        _DYNAMO_PRIMED = True


def _is_compiled(fn) -> bool:
    """Whether `fn` is torch.compile's work (a compiled module or function)."""
    return hasattr(fn, "_orig_mod") or hasattr(fn, "_torchdynamo_orig_callable")


def _compiled_step(feeds, model, loss_fn, options):
    """(feeds, model, loss_fn) as the runner calls them, compiled: each feed stage on its own,
    and the model's forward with the loss as one region (so the loss fuses with the last layer
    and autocast regions close inside it). The runner calls model(x) then loss_fn(out, *target):
    the model becomes the identity and loss_fn the compiled region."""
    def forward_loss(x, *target):
        return loss_fn(model(x), *target)

    def feed_call(f):
        def feed(x):
            return f(x)
        return feed
    region = _serialized(torch.compile(_own_code(forward_loss), **options))
    compiled_feeds = [(name, _serialized(torch.compile(_own_code(feed_call(f)), **options)))
                      for name, f in feeds]
    return compiled_feeds, _identity, region
