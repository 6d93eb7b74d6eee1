"""What bless needs of the operating system: durable writes, bounded reads, tree walks, process identity, the
files a user names, and the deadline of one network exchange."""
