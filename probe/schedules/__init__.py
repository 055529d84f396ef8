"""A schedule as data, below the checkpoint that records it and the trainer that runs it:

- ``points``: a point in the run (``At``: a step or a fraction of the run) and its ``--set`` spellings.
- ``settings``: a schedule as independent settings (``ScheduleConfig``), the rules between them, the table of named
  variants (``VARIANTS``) and the one name of any schedule.
- ``legacy``: every old spelling (old kinds, bare-number points, old ``--set`` items), read there and nowhere else.
"""
