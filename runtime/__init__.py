"""What runs on the cluster. Heavy dependencies are imported inside, never by the compiler."""
