"""Row work on Arrow tables, Beam-free: the layer the Beam shells of transforms/ delegate to."""
