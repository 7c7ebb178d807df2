"""What queue mode (``queues/``) and stream mode (``streams/``) share: the schema and Arrow rows, admission
control, and Spark's read-limit types."""
