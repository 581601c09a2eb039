"""How often the run starts again an actor lost before it ever ran."""

ANYWHERE_RESTARTS = 1
"""New starts of an actor that may go to any node (collectors, ranks but rank 0) when it is lost
before it ever ran. Ray may place it on a node that died moments ago (it takes seconds to
notice, as when a run is resumed right after losing one); the new start goes to a live node.
An actor lost while the run uses it still stops the run."""
