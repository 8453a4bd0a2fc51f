//! etcdctl 3.5's command tree: every command, its flags, their defaults
//! and help texts (etcdctl/ctlv3/ctl.go and command/*.go).

use crate::cobra::{flag, hidden, short, with_help_command, Cmd, Kind::*};

const PUT_LONG: &str = "
Puts the given key into the store.

When <value> begins with '-', <value> is interpreted as a flag.
Insert '--' for workaround:

$ put <key> -- <value>
$ put -- <key> <value>

If <value> isn't given as a command line argument and '--ignore-value' is not specified,
this command tries to read the value from standard input.

If <lease> isn't given as a command line argument and '--ignore-lease' is not specified,
this command tries to read the value from standard input.

For example,
$ cat file | put <key>
will store the content of the file to <key>.
";

pub fn root() -> Cmd {
    let mut root = Cmd::group(
        "etcdctl",
        "A simple command line client for etcd3.",
        vec![
            Cmd::new("get [options] <key> [range_end]", "Gets the key or a range of keys").flags(vec![
                flag("consistency", Str, "l", "Linearizable(l) or Serializable(s)"),
                flag("order", Str, "", "Order of results; ASCEND or DESCEND (ASCEND by default)"),
                flag("sort-by", Str, "", "Sort target; CREATE, KEY, MODIFY, VALUE, or VERSION"),
                flag("limit", Int, "0", "Maximum number of results"),
                flag("prefix", Bool, "false", "Get keys with matching prefix"),
                flag("from-key", Bool, "false", "Get keys that are greater than or equal to the given key using byte compare"),
                flag("rev", Int, "0", "Specify the kv revision"),
                flag("keys-only", Bool, "false", "Get only the keys"),
                flag("count-only", Bool, "false", "Get only the count"),
                flag("print-value-only", Bool, "false", "Only write values when using the \"simple\" output format"),
            ]),
            Cmd::new(
                "put [options] <key> <value> (<value> can also be given from stdin)",
                "Puts the given key into the store",
            )
            .long(PUT_LONG)
            .flags(vec![
                flag("lease", Str, "0", "lease ID (in hexadecimal) to attach to the key"),
                flag("prev-kv", Bool, "false", "return the previous key-value pair before modification"),
                flag("ignore-value", Bool, "false", "updates the key using its current value"),
                flag("ignore-lease", Bool, "false", "updates the key using its current lease"),
            ]),
            Cmd::new("del [options] <key> [range_end]", "Removes the specified key or range of keys [key, range_end)").flags(vec![
                flag("prefix", Bool, "false", "delete keys with matching prefix"),
                flag("prev-kv", Bool, "false", "return deleted key-value pairs"),
                flag("from-key", Bool, "false", "delete keys that are greater than or equal to the given key using byte compare"),
            ]),
            Cmd::new("txn [options]", "Txn processes all the requests in one transaction").flags(vec![
                short("interactive", 'i', Bool, "false", "Input transaction in interactive mode"),
            ]),
            Cmd::new("compaction [options] <revision>", "Compacts the event history in etcd").flags(vec![
                flag("physical", Bool, "false", "'true' to wait for compaction to physically remove all old revisions"),
            ]),
            Cmd::group("alarm <subcommand>", "Alarm related commands", vec![
                Cmd::new("disarm", "Disarms all alarms"),
                Cmd::new("list", "Lists all alarms"),
            ]),
            Cmd::new("defrag", "Defragments the storage of the etcd members with given endpoints")
                .persistent(vec![flag("cluster", Bool, "false", "use all endpoints from the cluster member list")])
                .flags(vec![flag("data-dir", Str, "", "Optional. If present, defragments a data directory not in use by etcd.")]),
            Cmd::group("endpoint <subcommand>", "Endpoint related commands", vec![
                Cmd::new("health", "Checks the healthiness of endpoints specified in `--endpoints` flag"),
                Cmd::new("status", "Prints out the status of endpoints specified in `--endpoints` flag").long(
                    "When --write-out is set to simple, this command prints out comma-separated status lists for each endpoint.\nThe items in the lists are endpoint, ID, version, db size, is leader, is learner, raft term, raft index, raft applied index, errors.\n",
                ),
                Cmd::new("hashkv", "Prints the KV history hash for each endpoint in --endpoints")
                    .persistent(vec![flag("rev", Int, "0", "maximum revision to hash (default: all revisions)")]),
            ])
            .persistent(vec![flag("cluster", Bool, "false", "use all endpoints from the cluster member list")]),
            Cmd::new("move-leader <transferee-member-id>", "Transfers leadership to another etcd cluster member."),
            Cmd::new(
                "watch [options] [key or prefix] [range_end] [--] [exec-command arg1 arg2 ...]",
                "Watches events stream on keys or prefixes",
            )
            .flags(vec![
                short("interactive", 'i', Bool, "false", "Interactive mode"),
                flag("prefix", Bool, "false", "Watch on a prefix if prefix is set"),
                flag("rev", Int, "0", "Revision to start watching"),
                flag("prev-kv", Bool, "false", "get the previous key-value pair before the event happens"),
                flag("progress-notify", Bool, "false", "get periodic watch progress notification from server"),
            ]),
            Cmd::new("version", "Prints the version of etcdctl"),
            Cmd::group("lease <subcommand>", "Lease related commands", vec![
                Cmd::new("grant <ttl>", "Creates leases"),
                Cmd::new("revoke <leaseID>", "Revokes leases"),
                Cmd::new("timetolive <leaseID> [options]", "Get lease information")
                    .flags(vec![flag("keys", Bool, "false", "Get keys attached to this lease")]),
                Cmd::new("list", "List all active leases"),
                Cmd::new("keep-alive [options] <leaseID>", "Keeps leases alive (renew)").flags(vec![flag(
                    "once",
                    Bool,
                    "false",
                    "Resets the keep-alive time to its original value and cobrautl.Exits immediately",
                )]),
            ]),
            Cmd::group("member <subcommand>", "Membership related commands", vec![
                Cmd::new("add <memberName> [options]", "Adds a member into the cluster").flags(vec![
                    flag("peer-urls", Str, "", "comma separated peer URLs for the new member."),
                    flag("learner", Bool, "false", "indicates if the new member is raft learner"),
                ]),
                Cmd::new("remove <memberID>", "Removes a member from the cluster"),
                Cmd::new("update <memberID> [options]", "Updates a member in the cluster")
                    .flags(vec![flag("peer-urls", Str, "", "comma separated peer URLs for the updated member.")]),
                Cmd::new("list", "Lists all members in the cluster").long(
                    "When --write-out is set to simple, this command prints out comma-separated member lists for each endpoint.\nThe items in the lists are ID, Status, Name, Peer Addrs, Client Addrs, Is Learner.\n",
                ),
                Cmd::new("promote <memberID>", "Promotes a non-voting member in the cluster")
                    .long("Promotes a non-voting learner member to a voting one in the cluster.\n"),
            ]),
            Cmd::group("snapshot <subcommand>", "Manages etcd node snapshots", vec![
                Cmd::new("save <filename>", "Stores an etcd node backend snapshot to a given file"),
                Cmd::new("status <filename>", "[deprecated] Gets backend snapshot status of a given file").long(
                    "When --write-out is set to simple, this command prints out comma-separated status lists for each endpoint.\nThe items in the lists are hash, revision, total keys, total size.\n\nMoved to 'etcdctl snapshot status ...'\n",
                ),
                Cmd::new("restore <filename> [options]", "Restores an etcd member snapshot to an etcd directory")
                    .long("Moved to `etcdctl snapshot restore ...`\n")
                    .flags(vec![
                        flag("data-dir", Str, "", "Path to the data directory"),
                        flag("wal-dir", Str, "", "Path to the WAL directory (use --data-dir if none given)"),
                        flag("initial-cluster", Str, "default=http://localhost:2380", "Initial cluster configuration for restore bootstrap"),
                        flag("initial-cluster-token", Str, "etcd-cluster", "Initial cluster token for the etcd cluster during restore bootstrap"),
                        flag("initial-advertise-peer-urls", Str, "http://localhost:2380", "List of this member's peer URLs to advertise to the rest of the cluster"),
                        flag("name", Str, "default", "Human-readable name for this member"),
                        flag("skip-hash-check", Bool, "false", "Ignore snapshot integrity hash value (required if copied from data directory)"),
                    ]),
            ]),
            Cmd::new("make-mirror [options] <destination>", "Makes a mirror at the destination etcd cluster").flags(vec![
                flag("prefix", Str, "", "Key-value prefix to mirror"),
                // etcdctl 3.6's flag, hidden so that the usage page stays 3.5's:
                // 0 (the default) commits each source revision as one txn, as
                // 3.5 does; N > 0 also splits a revision's events into txns of N.
                hidden(flag("max-txn-ops", Uint, "0", "Maximum number of operations permitted in a transaction during syncing updates.")),
                flag("dest-prefix", Str, "", "destination prefix to mirror a prefix to a different prefix in the destination cluster"),
                flag("no-dest-prefix", Bool, "false", "mirror key-values to the root of the destination cluster"),
                flag("dest-cert", Str, "", "Identify secure client using this TLS certificate file for the destination cluster"),
                flag("dest-key", Str, "", "Identify secure client using this TLS key file"),
                flag("dest-cacert", Str, "", "Verify certificates of TLS enabled secure servers using this CA bundle"),
                flag("dest-insecure-transport", Bool, "true", "Disable transport security for client connections"),
                flag("dest-user", Str, "", "Destination username[:password] for authentication (prompt if password is not supplied)"),
                flag("dest-password", Str, "", "Destination password for authentication (if this option is used, --user option shouldn't include password)"),
            ]),
            Cmd::new("lock <lockname> [exec-command arg1 arg2 ...]", "Acquires a named lock")
                .flags(vec![flag("ttl", Int, "10", "timeout for session")]),
            Cmd::new("elect <election-name> [proposal]", "Observes and participates in leader election")
                .flags(vec![short("listen", 'l', Bool, "false", "observation mode")]),
            Cmd::group("auth <enable or disable>", "Enable or disable authentication", vec![
                Cmd::new("enable", "Enables authentication"),
                Cmd::new("disable", "Disables authentication"),
                Cmd::new("status", "Returns authentication status"),
            ]),
            Cmd::group("user <subcommand>", "User related commands", vec![
                Cmd::new("add <user name or user:password> [options]", "Adds a new user").flags(vec![
                    flag("interactive", Bool, "true", "Read password from stdin instead of interactive terminal"),
                    flag("new-user-password", Str, "", "Supply password from the command line flag"),
                    flag("no-password", Bool, "false", "Create a user without password (CN based auth only)"),
                ]),
                Cmd::new("delete <user name>", "Deletes a user"),
                Cmd::new("get <user name> [options]", "Gets detailed information of a user")
                    .flags(vec![flag("detail", Bool, "false", "Show permissions of roles granted to the user")]),
                Cmd::new("list", "Lists all users"),
                Cmd::new("passwd <user name> [options]", "Changes password of user").flags(vec![flag(
                    "interactive",
                    Bool,
                    "true",
                    "If true, read password from stdin instead of interactive terminal",
                )]),
                Cmd::new("grant-role <user name> <role name>", "Grants a role to a user"),
                Cmd::new("revoke-role <user name> <role name>", "Revokes a role from a user"),
            ]),
            Cmd::group("role <subcommand>", "Role related commands", vec![
                Cmd::new("add <role name>", "Adds a new role"),
                Cmd::new("delete <role name>", "Deletes a role"),
                Cmd::new("get <role name>", "Gets detailed information of a role"),
                Cmd::new("list", "Lists all roles"),
                Cmd::new(
                    "grant-permission [options] <role name> <permission type> <key> [endkey]",
                    "Grants a key to a role",
                )
                .flags(vec![
                    flag("prefix", Bool, "false", "grant a prefix permission"),
                    flag("from-key", Bool, "false", "grant a permission of keys that are greater than or equal to the given key using byte compare"),
                ]),
                Cmd::new("revoke-permission <role name> <key> [endkey]", "Revokes a key from a role").flags(vec![
                    flag("prefix", Bool, "false", "revoke a prefix permission"),
                    flag("from-key", Bool, "false", "revoke a permission of keys that are greater than or equal to the given key using byte compare"),
                ]),
            ]),
            Cmd::group("check <subcommand>", "commands for checking properties of the etcd cluster", vec![
                Cmd::new("perf [options]", "Check the performance of the etcd cluster").flags(vec![
                    flag("load", Str, "s", "The performance check's workload model. Accepted workloads: s(small), m(medium), l(large), xl(xLarge)"),
                    flag("prefix", Str, "/etcdctl-check-perf/", "The prefix for writing the performance check's keys."),
                    flag("auto-compact", Bool, "false", "Compact storage with last revision after test is finished."),
                    flag("auto-defrag", Bool, "false", "Defragment storage after test is finished."),
                ]),
                Cmd::new(
                    "datascale [options]",
                    "Check the memory usage of holding data for different workloads on a given server endpoint.",
                )
                .long("If no endpoint is provided, localhost will be used. If multiple endpoints are provided, first endpoint will be used.")
                .flags(vec![
                    flag("load", Str, "s", "The datascale check's workload model. Accepted workloads: s(small), m(medium), l(large), xl(xLarge)"),
                    flag("prefix", Str, "/etcdctl-check-datascale/", "The prefix for writing the datascale check's keys."),
                    flag("auto-compact", Bool, "false", "Compact storage with last revision after test is finished."),
                    flag("auto-defrag", Bool, "false", "Defragment storage after test is finished."),
                ]),
            ]),
        ],
    );
    root.use_ = "etcdctl";
    root.persistent = vec![
        flag("endpoints", Strings, "[127.0.0.1:2379]", "gRPC endpoints"),
        flag("debug", Bool, "false", "enable client-side debug logging"),
        short("write-out", 'w', Str, "simple", "set the output format (fields, json, protobuf, simple, table)"),
        flag("hex", Bool, "false", "print byte strings as hex encoded strings"),
        flag("dial-timeout", Duration, "2s", "dial timeout for client connections"),
        flag("command-timeout", Duration, "5s", "timeout for short running command (excluding dial timeout)"),
        flag("keepalive-time", Duration, "2s", "keepalive time for client connections"),
        flag("keepalive-timeout", Duration, "6s", "keepalive timeout for client connections"),
        flag("insecure-transport", Bool, "true", "disable transport security for client connections"),
        flag("insecure-discovery", Bool, "true", "accept insecure SRV records describing cluster endpoints"),
        flag(
            "insecure-skip-tls-verify",
            Bool,
            "false",
            "skip server certificate verification (CAUTION: this option should be enabled only for testing purposes)",
        ),
        flag("cert", Str, "", "identify secure client using this TLS certificate file"),
        flag("key", Str, "", "identify secure client using this TLS key file"),
        flag("cacert", Str, "", "verify certificates of TLS-enabled secure servers using this CA bundle"),
        flag("user", Str, "", "username[:password] for authentication (prompt if password is not supplied)"),
        flag(
            "password",
            Str,
            "",
            "password for authentication (if this option is used, --user option shouldn't include password)",
        ),
        short("discovery-srv", 'd', Str, "", "domain name to query for SRV records describing cluster endpoints"),
        flag("discovery-srv-name", Str, "", "service name to query when using DNS discovery"),
    ];
    with_help_command(root)
}
