"""Pure statistics: intervals and the drop bound (``stats.drop_bound``, exact with one
sample per problem in ``paired_bound``, betting with repeats in ``cluster_bound``)
and sample-size planning (``planning``). Numbers in, numbers out.

May import: nothing of relaxtune outside this wing.
"""
