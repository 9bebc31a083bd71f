"""Learning from rollouts: the built-in task's training (:mod:`.training`,
:mod:`.train_prefix`), noise steering with SAC (:mod:`.dsrl`) and RECAP
(:mod:`.recap`). Above the episode core and the offline tools; below the doors.
"""
