"""The three methods, one module each: settings checks, pure math, and the module attached to attention."""
