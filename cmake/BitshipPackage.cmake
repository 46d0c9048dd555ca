# package export: being written
