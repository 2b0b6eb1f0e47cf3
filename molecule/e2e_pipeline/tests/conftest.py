pytest_plugins = ["gpufleet_testinfra"]
