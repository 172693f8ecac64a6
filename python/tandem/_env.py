"""The words tandem's on/off environment settings read (TANDEM_TUNED_CONV, TANDEM_TUNED_CONV_GROUPS,
TANDEM_CONV_PREBUILD and TANDEM_MODE_CACHE's "off") and its counts (TANDEM_CONV_PREBUILD_THREADS),
in one place so every setting reads them alike."""
import os
import warnings

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


def switch(name: str, default: bool) -> bool:
    """An on/off environment setting: one of ON or OFF (any case), unset or empty the default;
    anything else the default with a warning that names it."""
    value = os.environ.get(name, "").strip()
    word = value.lower()
    if word in ON:
        return True
    if word in OFF:
        return False
    if value:
        warnings.warn(f"tandem: {name}={value!r} is not understood: expected 1, on, true or yes, "
                      f"or 0, off, false or no; it stays {'on' if default else 'off'}",
                      stacklevel=3)
    return default


def count(name: str, default: int, low: int = 1, high: int = 1024) -> int:
    """A whole-number environment setting from `low` to `high`: unset or empty the default;
    anything else the default with a warning that names it and what was expected."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or not low <= n <= high:
        warnings.warn(f"tandem: {name}={value!r} is not understood: expected a whole number from "
                      f"{low} to {high}; it stays {default}", stacklevel=3)
        return default
    return n
