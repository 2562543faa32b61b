"""Stand-ins for the third-party software around the gateway (inference workers today; gRPC engines,
an engine core and providers later), for tests, benchmarks and ``make run``. Never imported by the
product packages (checked by the import contract)."""
