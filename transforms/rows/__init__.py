"""Row work: Arrow and numpy over the rows of a read unit or a bucket, no Beam."""
