"""The hub's side of training jobs (issue 26): the scheduler that starts each attempt as the
owner's ``job-*`` server(s) through the hub's own REST API and watches it end
(:mod:`.scheduler`), how an attempt ended and what comes next after a preemption or a lost node
(:mod:`.resume`), gangs over many Swarm nodes (:mod:`.gang`), and the job's output kept across
attempts (:mod:`.logs`)."""
