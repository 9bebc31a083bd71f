"""Ray actors: batch rollouts (:mod:`.actors`), joining a cluster (:mod:`.connect`),
replay (:mod:`.replay`) and branches (:mod:`.branch`) on actors.

Ray is imported only when a pool starts (``pip install 'rollcap[ray]'``).
"""
