"""Courses: classroom teaching on gpulab, each course a JupyterHub group.

- :mod:`.groups`: a course kept as a group (students are its members, the rest in its
  properties) and its staff roles, scoped to the group with JupyterHub's RBAC.
- :mod:`.roster`: the roster CSV a teacher uploads, parsed and checked before anything changes.
- :mod:`.handlers`: ``/hub/api/gpulab/courses``, thin handlers over both.

What a course allows and which course a server runs under is :mod:`gpulab.spawners.courses`
(the spawner applies it); the money (credit pool, caps) is the billing service's.
"""
