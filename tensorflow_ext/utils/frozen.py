"""FrozenValue: the base of immutable value objects (the embedding's admission and eviction policies).

A subclass names its arguments in `_FIELDS` (constructor order), sets them once in `__init__` with
`object.__setattr__`, and says what it is in `_FROZEN_WHAT` (the error of a later change names it). Two values of
one class with equal fields are equal and hash alike; pickling rebuilds a value by calling its class with its fields.
"""


class FrozenValue(object):
    """An immutable value: equality, hash and pickling by `_FIELDS`; setting or deleting an attribute raises."""

    __slots__ = ()
    _FIELDS = ()
    _FROZEN_WHAT = "a frozen value"

    def __setattr__(self, name, value):
        raise AttributeError("%s cannot be changed (%s): create a new one" % (self._FROZEN_WHAT, name))

    def __delattr__(self, name):
        raise AttributeError("%s cannot be changed (%s): create a new one" % (self._FROZEN_WHAT, name))

    def _key(self):
        return tuple(getattr(self, k) for k in self._FIELDS)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash((type(self).__name__,) + self._key())

    def __reduce__(self):
        return (type(self), self._key())
