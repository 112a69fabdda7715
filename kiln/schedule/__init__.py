"""graph -> Plan: fusion, layouts, kernel IR, schedules (see plan.py); the runtime runs the Plan."""
