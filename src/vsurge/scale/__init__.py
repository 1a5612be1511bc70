"""Scale-out: one engine loop (engine/) run on many devices and processes.

    replicas.py     the model on a mesh per engine: data-parallel replicas, the prefill and decode
                    device groups of disaggregated serving, their page pools agreed
    multihost.py    several processes run the same engines: process 0 plans, publishes each device
                    call; the others follow (`Leader`, `follow`)
    remote.py       disaggregated serving across processes: decode engines on other processes,
                    driven by process 0 over the same channel (`RemoteDecodeEngine`)
    distributed.py  jax.distributed from flags or the environment
    flags.py        the command-line flags of all of the above (`vsurge serve -tp/-dp/--prefill-devices ...`)

The hand-over between a prefill and a decode engine inside one process is the driver's
(engine/disaggregated.py) and the page copies are the core's (engine/transfer.py): this package
only places engines and runs them on more processes. Nothing here is imported by engine/.
"""
