"""Name -> object tables filled by decorators (models, dataset kinds, training methods): adding one is one module."""


def registrar(table, what):
    """``register(name)``: a decorator that puts the decorated object into ``table`` under ``name``, once."""

    def register(name):
        def add(obj):
            if name in table:
                raise ValueError(f"{what} {name!r} is registered twice")
            table[name] = obj
            return obj

        return add

    return register
