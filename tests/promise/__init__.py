"""The promise checker: a seeded, randomized, black-box run of the product under faults.

Several real `orquestador worker` processes run flows of all three effect classes over
one database (an embedded PostgreSQL of the checker's own), calling a provider double
on 127.0.0.1 that keeps a ledger of every call, write and look-up. A fault schedule
drawn from the seed injects adapter timeouts with late writes, transient and
permanent errors, uncertain outcomes (cut connections, bad outputs), look-ups that
answer Found, NotFound or Unknown, kill -9 of workers, workers frozen past their lease
(SIGSTOP, then SIGCONT; some the instant before a charge's request leaves), a PostgreSQL
restart, cancels, operator decisions (with corrections, key fields included; two
deciders at once; a bulk retry against a single one), approvals decided near their
deadline and their cancel, keyed executions taking turns on slots, a schedule firing
every few seconds, rows held FOR UPDATE by a stranger, and poison platform events. The
provider is strict: a write is performed at its moment even when its caller has gone.
After a quiet phase the invariants of `invariants.py` and `blocking.py` are checked.

Determinism: everything random is drawn up front from the seed (`schedule.draw`): the
cases, their flows, which call of which step meets which fault, and the moment of every
timed action. The schedule, not the OS scheduler, is the source of randomness, so a
seed replays the same schedule exactly (`schedule.json` in the run folder). The
interleavings that timing decides (which worker claims what, where a kill lands, what a
cancel finds) cannot replay bit for bit across machines or loads; a violation found on a
seed usually comes back on a replay, and its evidence (printed) shows what happened.

Modules: `profiles` (how much a run does), `schedule` (what it does and when), `flows`
and `adapters` (what the workers run), `database` (the checker's server), `workers`,
`api` (the routes users and operators call), `platform_events`, `strangers` (row locks),
`timeline` (plays the schedule), `records` (what the checks read and report),
`invariants` (1 to 5, 7 to 14), `blocking` (6: no head-of-line blocking), `run` and
`report`. Long runs and what they found: docs/ARCHITECTURE.md, *The promise checker's
long runs*.
The provider double is `tests/acceptance/provider_double.py` in its instructed mode.
"""
