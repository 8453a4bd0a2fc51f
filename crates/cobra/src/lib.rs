//! etcdctl's and etcdutl's command line grammar, as cobra 1.1.3 and
//! pflag 1.0.5 (the versions etcd 3.5.1's tools are built with) parse and
//! print it; `retcdctl` and `retcdutl` describe their commands as data
//! ([`Cmd`], [`Flag`]) and run them through [`execute`].
//!
//! Scripts see cobra's behaviour, so it is reproduced rather than
//! approximated with a general-purpose parser: subcommands found by
//! unique prefix (`etcdutl snap stat`, `etcdctl compact`), flags anywhere
//! on the line, booleans with an optional `=value`, `--` ending the flags,
//! a command group run alone printing its usage (exit 0), cobra's error
//! texts (`unknown command "x" for "etcdutl"`, `unknown flag: --x`, `flag
//! needs an argument: --data-dir`, `bad flag syntax: ---x`, `required
//! flag(s) "data-dir" not set`, `invalid argument "x" for "--rev" flag:
//! strconv.ParseInt: ...`) and its default usage template rendered as
//! `text/template` does (etcdctl prints its own page: retcdctl's `cobra`
//! module).
//!
//! Two quirks of cobra 1.1.3 matter: while it looks for the command
//! (`Find`) the `--help` flag is not registered yet, so `--help` and `-h`
//! take the next word as their value there (`etcdctl --help get` is the
//! root's help); and `legacyArgs` refuses an unknown word only under
//! the root (`etcdutl snapshot bogus` prints the group's usage).

use std::collections::{BTreeMap, HashSet};

use retcd_gostd::strconv;
pub use retcd_gostd::strconv::{quote as go_quote, quote_rune as go_quote_rune};

/// A pflag value type (what `Value.Type()` returns decides the usage
/// line and how `Set` checks a value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Str,
    Int,
    Uint,
    Duration,
    Float,
    /// pflag's `StringSlice` (`--endpoints a,b`, one CSV record): its
    /// value and default are written as pflag prints them, `[a,b]`.
    Strings,
}

#[derive(Clone, Debug)]
pub struct Flag {
    pub name: &'static str,
    pub short: Option<char>,
    pub kind: Kind,
    pub default: &'static str,
    pub usage: String,
    /// cobra's `MarkFlagRequired`.
    pub required: bool,
    /// pflag's `MarkHidden`: accepted, but not listed in usage pages.
    pub hidden: bool,
}

pub fn flag(name: &'static str, kind: Kind, default: &'static str, usage: &str) -> Flag {
    Flag {
        name,
        short: None,
        kind,
        default,
        usage: usage.to_string(),
        required: false,
        hidden: false,
    }
}

/// A flag with a one-letter form (`-w`).
pub fn short(name: &'static str, s: char, kind: Kind, default: &'static str, usage: &str) -> Flag {
    Flag {
        short: Some(s),
        ..flag(name, kind, default, usage)
    }
}

pub fn hidden(f: Flag) -> Flag {
    Flag { hidden: true, ..f }
}

pub fn required(f: Flag) -> Flag {
    Flag {
        required: true,
        ..f
    }
}

/// One cobra command.
#[derive(Clone, Debug, Default)]
pub struct Cmd {
    pub name: &'static str,
    pub use_: &'static str,
    pub short: &'static str,
    pub long: &'static str,
    pub flags: Vec<Flag>,
    pub persistent: Vec<Flag>,
    pub subs: Vec<Cmd>,
    pub runnable: bool,
    /// Not listed in usage pages or suggestions.
    pub hidden: bool,
    /// Found by its whole name only (not by a prefix): a command etcdutl
    /// lacks must not take a prefix that etcdutl refuses.
    pub exact: bool,
    pub disable_flags_in_use_line: bool,
}

impl Cmd {
    pub fn new(use_: &'static str, short: &'static str) -> Cmd {
        Cmd {
            name: use_.split(' ').next().unwrap_or(use_),
            use_,
            short,
            runnable: true,
            ..Cmd::default()
        }
    }

    pub fn group(use_: &'static str, short: &'static str, subs: Vec<Cmd>) -> Cmd {
        Cmd {
            runnable: false,
            subs,
            ..Cmd::new(use_, short)
        }
    }

    pub fn flags(mut self, f: Vec<Flag>) -> Cmd {
        self.flags = f;
        self
    }

    pub fn long(mut self, l: &'static str) -> Cmd {
        self.long = l;
        self
    }

    pub fn persistent(mut self, f: Vec<Flag>) -> Cmd {
        self.persistent = f;
        self
    }

    pub fn hidden(mut self) -> Cmd {
        self.hidden = true;
        self.exact = true;
        self
    }

    fn sub(&self, name: &str) -> &Cmd {
        self.subs
            .iter()
            .find(|s| s.name == name)
            .expect("a valid path")
    }

    /// cobra's `IsAvailableCommand` (the help command is not).
    pub fn available(&self) -> bool {
        !self.hidden && self.name != "help" && (self.runnable || self.has_available_subs())
    }

    fn has_available_subs(&self) -> bool {
        self.subs.iter().any(Cmd::available)
    }
}

/// The root command with cobra's `help` command added (as
/// `InitDefaultHelpCmd` does for a root with subcommands).
pub fn with_help_command(mut root: Cmd) -> Cmd {
    let long: &'static str = Box::leak(
        format!(
            "Help provides help for any command in the application.\nSimply type {} help [path to command] for full details.",
            root.name
        )
        .into_boxed_str(),
    );
    root.subs
        .push(Cmd::new("help [command]", "Help about any command").long(long));
    root
}

/// The parsed command line.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// Command names below the root, e.g. `["snapshot", "restore"]`.
    pub path: Vec<&'static str>,
    /// The positional arguments.
    pub args: Vec<String>,
    values: BTreeMap<&'static str, String>,
    changed: HashSet<&'static str>,
    /// Every flag the command takes (its own first, then inherited).
    pub all_flags: Vec<Flag>,
    /// The flags it inherits (its ancestors' persistent flags).
    pub inherited: Vec<Flag>,
    /// How many arguments came before `--` (cobra's `ArgsLenAtDash`).
    pub dash_at: Option<usize>,
}

impl Parsed {
    pub fn get(&self, name: &str) -> &str {
        self.values.get(name).map(String::as_str).unwrap_or("")
    }

    pub fn bool(&self, name: &str) -> bool {
        self.get(name) == "true"
    }

    pub fn i64(&self, name: &str) -> i64 {
        self.get(name).parse().unwrap_or(0)
    }

    pub fn u64(&self, name: &str) -> u64 {
        self.get(name).parse().unwrap_or(0)
    }

    pub fn f64(&self, name: &str) -> f64 {
        self.get(name).parse().unwrap_or(0.0)
    }

    /// A duration flag (a negative one counts as zero).
    pub fn dur(&self, name: &str) -> std::time::Duration {
        retcd_gostd::time::parse_duration(self.get(name))
            .map(|d| std::time::Duration::from_nanos(d.max(0) as u64))
            .unwrap_or_default()
    }

    /// A string slice flag's items.
    pub fn strings(&self, name: &str) -> Vec<String> {
        let v = self.get(name);
        let v = v.strip_prefix('[').unwrap_or(v);
        let v = v.strip_suffix(']').unwrap_or(v);
        if v.is_empty() {
            return Vec::new();
        }
        v.split(',').map(str::to_string).collect()
    }

    pub fn is_changed(&self, name: &str) -> bool {
        self.changed.contains(name)
    }

    /// Sets a flag as pflag's `Set` does (the command line, and
    /// `ETCDCTL_*` variables); the error is `Set`'s own (without the
    /// `invalid argument` wrapping).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let f = self
            .all_flags
            .iter()
            .find(|f| f.name == name)
            .cloned()
            .ok_or_else(|| format!("no such flag -{name}"))?;
        let v = normalize_value(&f, value)?;
        if f.kind == Kind::Strings && self.changed.contains(f.name) {
            let old = self.get(f.name);
            let old = old.trim_start_matches('[').trim_end_matches(']');
            let new = v.trim_start_matches('[').trim_end_matches(']');
            self.values.insert(f.name, format!("[{old},{new}]"));
        } else {
            self.values.insert(f.name, v);
        }
        self.changed.insert(f.name);
        Ok(())
    }
}

/// Checks and normalises a flag value as the pflag value's `Set` does.
fn normalize_value(f: &Flag, v: &str) -> Result<String, String> {
    let num = |e: strconv::NumError| e.to_string();
    match f.kind {
        Kind::Bool => strconv::parse_bool(v).map(|b| b.to_string()).map_err(num),
        Kind::Str => Ok(v.to_string()),
        Kind::Int => strconv::parse_int(v, 0, 64)
            .map(|n| n.to_string())
            .map_err(num),
        Kind::Uint => strconv::parse_uint(v, 0, 64)
            .map(|n| n.to_string())
            .map_err(num),
        Kind::Float => v.parse::<f64>().map(|n| n.to_string()).map_err(|_| {
            format!(
                "strconv.ParseFloat: parsing {}: invalid syntax",
                go_quote(v)
            )
        }),
        Kind::Duration => retcd_gostd::time::parse_duration(v).map(|_| v.to_string()),
        Kind::Strings => read_csv_record(v).map(|parts| format!("[{}]", parts.join(","))),
    }
}

/// One record of `encoding/csv` (how pflag reads a string slice value).
pub fn read_csv_record(s: &str) -> Result<Vec<String>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    if !s.contains('"') {
        return Ok(s.split(',').map(str::to_string).collect());
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    let mut in_quotes = false;
    let mut field_start = true;
    while let Some(c) = chars.next() {
        if in_quotes {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    in_quotes = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' && field_start {
            in_quotes = true;
            field_start = false;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
            field_start = true;
        } else {
            cur.push(c);
            field_start = false;
        }
    }
    if in_quotes {
        return Err(
            "parse error on line 1, column 0: extraneous or missing \" in quoted-field".into(),
        );
    }
    out.push(cur);
    Ok(out)
}

/// What cobra does with a command line, short of running the command.
#[derive(Debug)]
pub enum Outcome {
    /// Run the command.
    Run(Parsed),
    /// Print the help of the command at `path` to stdout (exit 0).
    Help(Vec<&'static str>),
    /// `Find` failed (an unknown command under the root): cobra prints
    /// `Error: msg` and `Run 'PATH --help' for usage.`.
    FindError {
        path: Vec<&'static str>,
        msg: String,
    },
    /// A flag error or a required flag left out: cobra prints `Error:
    /// msg` and the command's usage.
    FlagError {
        path: Vec<&'static str>,
        msg: String,
    },
}

/// The command at `path`.
pub fn lookup<'a>(root: &'a Cmd, path: &[&str]) -> &'a Cmd {
    path.iter().fold(root, |c, p| c.sub(p))
}

/// The persistent flags of the command's ancestors (cobra's
/// `parentsPflags`).
pub fn inherited(root: &Cmd, path: &[&str]) -> Vec<Flag> {
    let mut out: Vec<Flag> = Vec::new();
    let mut c = root;
    for p in path {
        out.extend(c.persistent.iter().cloned());
        c = c.sub(p);
    }
    out
}

/// The command's own flags (local and persistent), with `-h, --help` when
/// it is registered.
pub fn local(root: &Cmd, path: &[&str], help: bool) -> Vec<Flag> {
    let c = lookup(root, path);
    let mut out = c.flags.clone();
    out.extend(c.persistent.iter().cloned());
    if help && !out.iter().any(|f| f.name == "help") {
        out.push(Flag {
            short: Some('h'),
            ..flag("help", Kind::Bool, "false", &format!("help for {}", c.name))
        });
    }
    out
}

/// The command's own flags ([`local`]) and the inherited ones it does
/// not shadow (cobra's `LocalFlags` and `InheritedFlags`).
pub fn flag_sets(root: &Cmd, path: &[&str], help: bool) -> (Vec<Flag>, Vec<Flag>) {
    let local = local(root, path, help);
    let names: HashSet<&str> = local.iter().map(|x| x.name).collect();
    let inherited = inherited(root, path)
        .into_iter()
        .filter(|x| !names.contains(x.name))
        .collect();
    (local, inherited)
}

/// Every flag the command takes: its own, then the inherited ones.
pub fn all_flags(root: &Cmd, path: &[&str], help: bool) -> Vec<Flag> {
    let (mut f, inherited) = flag_sets(root, path, help);
    f.extend(inherited);
    f
}

fn no_opt(flags: &[Flag], name: &str) -> bool {
    flags.iter().any(|f| f.name == name && f.kind == Kind::Bool)
}

fn short_no_opt(flags: &[Flag], s: &str) -> bool {
    let Some(c) = s.chars().next() else {
        return false;
    };
    flags
        .iter()
        .any(|f| f.short == Some(c) && f.kind == Kind::Bool)
}

/// cobra 1.1.3's `stripFlags`: the words of `args` that are not flags or
/// flag values.
fn strip_flags(args: &[String], flags: &[Flag]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let s = &args[i];
        i += 1;
        if s == "--" {
            break;
        }
        let long_takes = s.starts_with("--") && !s.contains('=') && !no_opt(flags, &s[2..]);
        let short_takes =
            s.starts_with('-') && !s.contains('=') && s.len() == 2 && !short_no_opt(flags, &s[1..]);
        if long_takes || short_takes {
            i += 1; // its value
        } else if !s.is_empty() && !s.starts_with('-') {
            out.push(s.clone());
        }
    }
    out
}

/// cobra 1.1.3's `argsMinusFirstX`.
fn args_minus_first(args: &[String], x: &str) -> Vec<String> {
    match args.iter().position(|a| a == x) {
        Some(i) => {
            let mut out = args[..i].to_vec();
            out.extend_from_slice(&args[i + 1..]);
            out
        }
        None => args.to_vec(),
    }
}

/// cobra's `findNext`: the child named `next`, or the only one it is a
/// prefix of (`EnablePrefixMatching`, which etcdutl sets).
fn find_next<'a>(c: &'a Cmd, next: &str) -> Option<&'a Cmd> {
    if let Some(s) = c.subs.iter().find(|s| s.name == next) {
        return Some(s);
    }
    let m: Vec<&Cmd> = c
        .subs
        .iter()
        .filter(|s| !s.exact && s.name.starts_with(next))
        .collect();
    if m.len() == 1 {
        Some(m[0])
    } else {
        None
    }
}

/// cobra's `Find`: the command `args` name, the arguments left for it,
/// and `legacyArgs`' error (an unknown word under the root).
pub fn find(root: &Cmd, args: &[String]) -> (Vec<&'static str>, Vec<String>, Option<String>) {
    let mut path: Vec<&'static str> = Vec::new();
    let mut cur = root;
    let mut rest = args.to_vec();
    loop {
        let words = strip_flags(&rest, &all_flags(root, &path, false));
        let Some(next) = words.first() else { break };
        match find_next(cur, next) {
            Some(c) => {
                rest = args_minus_first(&rest, next);
                path.push(c.name);
                cur = c;
            }
            None => break,
        }
    }
    let mut err = None;
    if path.is_empty() && !cur.subs.is_empty() {
        let words = strip_flags(&rest, &all_flags(root, &path, false));
        if let Some(w) = words.first() {
            err = Some(format!(
                "unknown command {} for {}{}",
                go_quote(w),
                go_quote(root.name),
                suggestions(root, w)
            ));
        }
    }
    (path, rest, err)
}

/// cobra's `findSuggestions`: "Did you mean this?" and the available
/// commands within a Levenshtein distance of 2 or starting with `typed`.
fn suggestions(root: &Cmd, typed: &str) -> String {
    let t = typed.to_lowercase();
    let found: Vec<&str> = root
        .subs
        .iter()
        .filter(|c| c.available())
        .filter(|c| levenshtein(&t, &c.name.to_lowercase()) <= 2 || c.name.starts_with(&t))
        .map(|c| c.name)
        .collect();
    if found.is_empty() {
        return String::new();
    }
    let mut s = "\n\nDid you mean this?\n".to_string();
    for f in found {
        s.push_str(&format!("\t{f}\n"));
    }
    s
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// What cobra's `ExecuteC` does with `args`, up to running the command.
pub fn execute(root: &Cmd, args: &[String]) -> Outcome {
    let (path, rest, err) = find(root, args);
    if let Some(msg) = err {
        return Outcome::FindError { path, msg };
    }
    let flags = all_flags(root, &path, true);
    let (_, inherited) = flag_sets(root, &path, true);
    let mut p = Parsed {
        path: path.clone(),
        args: Vec::new(),
        values: flags
            .iter()
            .map(|f| (f.name, f.default.to_string()))
            .collect(),
        changed: HashSet::new(),
        all_flags: flags.clone(),
        inherited,
        dash_at: None,
    };
    if let Err(msg) = parse_flags(&mut p, &flags, &rest) {
        return Outcome::FlagError { path, msg };
    }
    let cmd = lookup(root, &path);
    if p.bool("help") || !cmd.runnable {
        return Outcome::Help(path);
    }
    let missing: Vec<&str> = {
        let mut f: Vec<&Flag> = flags.iter().filter(|f| f.required).collect();
        f.sort_by_key(|f| f.name);
        f.iter()
            .filter(|f| !p.is_changed(f.name))
            .map(|f| f.name)
            .collect()
    };
    if !missing.is_empty() {
        return Outcome::FlagError {
            path,
            msg: format!("required flag(s) \"{}\" not set", missing.join("\", \"")),
        };
    }
    Outcome::Run(p)
}

/// pflag's `parseArgs` (interspersed flags, `--` ends them).
fn parse_flags(p: &mut Parsed, flags: &[Flag], args: &[String]) -> Result<(), String> {
    let mut i = 0;
    while i < args.len() {
        let s = args[i].clone();
        i += 1;
        if s.len() < 2 || !s.starts_with('-') {
            p.args.push(s);
            continue;
        }
        if s == "--" {
            p.dash_at = Some(p.args.len());
            p.args.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(body) = s.strip_prefix("--") {
            if body.starts_with('-') || body.starts_with('=') {
                return Err(format!("bad flag syntax: {s}"));
            }
            let (name, val) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let Some(f) = flags.iter().find(|f| f.name == name) else {
                return Err(format!("unknown flag: --{name}"));
            };
            let val = match val {
                Some(v) => v,
                None if f.kind == Kind::Bool => "true".to_string(),
                None if i < args.len() => {
                    i += 1;
                    args[i - 1].clone()
                }
                None => return Err(format!("flag needs an argument: {s}")),
            };
            set(p, f, &val)?;
        } else {
            let mut shorts: &str = &s[1..];
            // pflag hands every letter of the group the same remaining
            // arguments; the last one that takes a value takes the next.
            let mut consumed = false;
            while !shorts.is_empty() {
                let c = shorts.chars().next().expect("non-empty");
                let Some(f) = flags.iter().find(|f| f.short == Some(c)) else {
                    return Err(format!(
                        "unknown shorthand flag: {} in -{shorts}",
                        go_quote_rune(c)
                    ));
                };
                let after = &shorts[c.len_utf8()..];
                let val;
                if let Some(v) = after.strip_prefix('=').filter(|_| after.len() > 1) {
                    val = v.to_string();
                    shorts = "";
                } else if f.kind == Kind::Bool {
                    val = "true".to_string();
                    shorts = after;
                } else if !after.is_empty() {
                    val = after.to_string();
                    shorts = "";
                } else if i < args.len() {
                    val = args[i].clone();
                    consumed = true;
                    shorts = "";
                } else {
                    return Err(format!(
                        "flag needs an argument: {} in -{shorts}",
                        go_quote_rune(c)
                    ));
                }
                set(p, f, &val)?;
            }
            if consumed {
                i += 1;
            }
        }
    }
    Ok(())
}

/// pflag's `Set` with its error text.
fn set(p: &mut Parsed, f: &Flag, val: &str) -> Result<(), String> {
    p.set(f.name, val).map_err(|e| {
        let name = match f.short {
            Some(s) => format!("-{s}, --{}", f.name),
            None => format!("--{}", f.name),
        };
        format!(
            "invalid argument {} for {} flag: {e}",
            go_quote(val),
            go_quote(&name)
        )
    })
}

/// pflag's `FlagUsages` (hidden flags left out), sorted by name, the
/// usage text aligned one column past the longest `--name type`, a
/// default that is not the type's zero value after it; trailing
/// whitespace trimmed (as the usage template's `trimTrailingWhitespaces`).
pub fn flag_usages(flags: &[Flag]) -> String {
    let mut fs: Vec<&Flag> = flags.iter().filter(|f| !f.hidden).collect();
    fs.sort_by_key(|f| f.name);
    fs.dedup_by_key(|f| f.name);
    let lines: Vec<(String, String)> = fs
        .iter()
        .map(|f| {
            let mut line = match f.short {
                Some(s) => format!("  -{s}, --{}", f.name),
                None => format!("      --{}", f.name),
            };
            let type_name = match f.kind {
                Kind::Bool => "",
                Kind::Str => "string",
                Kind::Int => "int",
                Kind::Uint => "uint",
                Kind::Duration => "duration",
                Kind::Float => "float",
                Kind::Strings => "strings",
            };
            if !type_name.is_empty() {
                line += &format!(" {type_name}");
            }
            let zero = match f.kind {
                Kind::Bool => f.default == "false",
                Kind::Str => f.default.is_empty(),
                Kind::Duration => f.default == "0" || f.default == "0s",
                Kind::Strings => f.default == "[]",
                _ => f.default == "0",
            };
            let mut usage = f.usage.clone();
            if !zero {
                usage += &match f.kind {
                    Kind::Str => format!(" (default {})", go_quote(f.default)),
                    _ => format!(" (default {})", f.default),
                };
            }
            (line, usage)
        })
        .collect();
    let width = lines.iter().map(|(l, _)| l.len() + 1).max().unwrap_or(0);
    let s: String = lines
        .iter()
        .map(|(l, u)| format!("{l} {} {u}\n", " ".repeat(width - l.len())))
        .collect();
    s.trim_end().to_string()
}

/// cobra's `CommandPath`: the root's name and the path.
pub fn command_path(root: &Cmd, path: &[&str]) -> String {
    let mut s = root.name.to_string();
    for p in path {
        s.push(' ');
        s.push_str(p);
    }
    s
}

/// cobra 1.1.3's default usage template for the command at `path` (what
/// etcdutl prints as its help too: its help template is
/// `{{.UsageString}}`).
pub fn usage(root: &Cmd, path: &[&str]) -> String {
    usage_with(root, path, true)
}

/// [`usage`]; without `help_flag` the command's `-h, --help` is not
/// listed (cobra registers it only on a command it runs or shows the help
/// of: `help bogus` prints the root's usage without it).
pub fn usage_with(root: &Cmd, path: &[&str], help_flag: bool) -> String {
    let c = lookup(root, path);
    let mut t = String::from("Usage:");
    if c.runnable {
        let mut useline = if path.is_empty() {
            c.use_.to_string()
        } else {
            format!("{} {}", command_path(root, &path[..path.len() - 1]), c.use_)
        };
        if !c.disable_flags_in_use_line && !useline.contains("[flags]") {
            useline.push_str(" [flags]");
        }
        t.push_str(&format!("\n  {useline}"));
    }
    if c.has_available_subs() {
        t.push_str(&format!("\n  {} [command]", command_path(root, path)));
        t.push_str("\n\nAvailable Commands:");
        let pad = c
            .subs
            .iter()
            .map(|s| s.name.len())
            .max()
            .unwrap_or(0)
            .max(11);
        let mut subs: Vec<&Cmd> = c.subs.iter().collect();
        subs.sort_by_key(|s| s.name);
        for s in subs {
            if s.available() || s.name == "help" {
                t.push_str(&format!("\n  {:<pad$} {}", s.name, s.short));
            }
        }
    }
    let (local, inh) = flag_sets(root, path, help_flag);
    if !local.is_empty() {
        t.push_str(&format!("\n\nFlags:\n{}", flag_usages(&local)));
    }
    if !inh.is_empty() {
        t.push_str(&format!("\n\nGlobal Flags:\n{}", flag_usages(&inh)));
    }
    if c.has_available_subs() {
        t.push_str(&format!(
            "\n\nUse \"{} [command] --help\" for more information about a command.",
            command_path(root, path)
        ));
    }
    t.push('\n');
    t
}

/// Go's `%#q` of a `[]string` (cobra's "Unknown help topic").
pub fn go_backquote_list(v: &[String]) -> String {
    let items: Vec<String> = v
        .iter()
        .map(|s| {
            if s.chars()
                .all(|c| c != '`' && (c == '\t' || !c.is_control()))
            {
                format!("`{s}`")
            } else {
                go_quote(s)
            }
        })
        .collect();
    format!("[{}]", items.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Cmd {
        let mut r = Cmd::group(
            "etcdutl",
            "An administrative command line tool for etcd3.",
            vec![
                Cmd::group(
                    "snapshot <subcommand>",
                    "Manages etcd node snapshots",
                    vec![Cmd::new("status <filename>", "Gets status")],
                ),
                Cmd::new("version", "Prints the version of etcdutl"),
            ],
        );
        r.persistent = vec![Flag {
            short: Some('w'),
            ..flag("write-out", Kind::Str, "simple", "set the output format")
        }];
        with_help_command(r)
    }

    fn a(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn prefixes_flags_and_errors() {
        match execute(&root(), &a(&["snap", "stat", "f", "-wjson"])) {
            Outcome::Run(p) => {
                assert_eq!(p.path, ["snapshot", "status"]);
                assert_eq!(p.args, ["f"]);
                assert_eq!(p.get("write-out"), "json");
            }
            o => panic!("{o:?}"),
        }
        match execute(&root(), &a(&["bogus"])) {
            Outcome::FindError { msg, .. } => {
                assert_eq!(msg, "unknown command \"bogus\" for \"etcdutl\"")
            }
            o => panic!("{o:?}"),
        }
        match execute(&root(), &a(&["versoin"])) {
            Outcome::FindError { msg, .. } => assert_eq!(
                msg,
                "unknown command \"versoin\" for \"etcdutl\"\n\nDid you mean this?\n\tversion\n"
            ),
            o => panic!("{o:?}"),
        }
        assert!(matches!(
            execute(&root(), &a(&["snapshot", "bogus"])),
            Outcome::Help(p) if p == ["snapshot"]
        ));
        // --help is not registered while the command is looked up
        assert!(matches!(
            execute(&root(), &a(&["--help", "snapshot"])),
            Outcome::Help(p) if p.is_empty()
        ));
        match execute(&root(), &a(&["snapshot", "status", "-x"])) {
            Outcome::FlagError { msg, .. } => assert_eq!(msg, "unknown shorthand flag: 'x' in -x"),
            o => panic!("{o:?}"),
        }
    }

    /// etcdctl's shape: typed flags, a persistent `-w`, prefixes.
    fn ctl() -> Cmd {
        with_help_command(
            Cmd::group(
                "etcdctl",
                "A simple command line client for etcd3.",
                vec![
                    Cmd::new("get [options] <key> [range_end]", "Gets keys").flags(vec![
                        flag("prefix", Kind::Bool, "false", "p"),
                        flag("rev", Kind::Int, "0", "r"),
                        hidden(flag("secret", Kind::Uint, "0", "s")),
                    ]),
                    Cmd::new("compaction [options] <revision>", "Compacts"),
                    Cmd::group(
                        "lease <subcommand>",
                        "Lease",
                        vec![Cmd::new("grant <ttl>", "Creates leases")],
                    ),
                ],
            )
            .persistent(vec![
                short("write-out", 'w', Kind::Str, "simple", "fmt"),
                flag("endpoints", Kind::Strings, "[127.0.0.1:2379]", "eps"),
                flag("dial-timeout", Kind::Duration, "2s", "dial"),
            ]),
        )
    }

    fn run(args: &[&str]) -> Parsed {
        match execute(&ctl(), &a(args)) {
            Outcome::Run(p) => p,
            o => panic!("{args:?}: {o:?}"),
        }
    }

    fn flag_error(args: &[&str]) -> String {
        match execute(&ctl(), &a(args)) {
            Outcome::FlagError { msg, .. } => msg,
            o => panic!("{args:?}: {o:?}"),
        }
    }

    #[test]
    fn etcdctl_lines() {
        let p = run(&["-w", "json", "compact", "4"]);
        assert_eq!(
            (p.path.as_slice(), p.args.as_slice()),
            (&["compaction"][..], &["4".to_string()][..])
        );
        assert_eq!(p.get("write-out"), "json");
        let p = run(&[
            "get",
            "k",
            "--prefix",
            "--rev=0x10",
            "-wjson",
            "--endpoints",
            "a,b",
            "--endpoints=c",
        ]);
        assert!(p.bool("prefix") && p.is_changed("rev"));
        assert_eq!(p.i64("rev"), 16);
        assert_eq!(p.strings("endpoints"), ["a", "b", "c"]);
        assert_eq!(run(&["get", "k"]).strings("endpoints"), ["127.0.0.1:2379"]);
        assert_eq!(
            run(&["get", "k", "--dial-timeout=1m"])
                .dur("dial-timeout")
                .as_secs(),
            60
        );
        let p = run(&["get", "k", "--", "-x", "y"]);
        assert_eq!((p.args.len(), p.dash_at), (3, Some(1)));
        assert_eq!(p.inherited.len(), 3);
        assert_eq!(
            flag_error(&["get", "k", "--rev", "x"]),
            "invalid argument \"x\" for \"--rev\" flag: strconv.ParseInt: parsing \"x\": invalid syntax"
        );
        assert_eq!(
            flag_error(&["get", "k", "-w"]),
            "flag needs an argument: 'w' in -w"
        );
        assert_eq!(flag_error(&["get", "---x"]), "bad flag syntax: ---x");
        assert_eq!(
            flag_error(&["get", "--dial-timeout=5"]),
            "invalid argument \"5\" for \"--dial-timeout\" flag: time: missing unit in duration \"5\""
        );
        // `-w=` gives `-w` the value "="
        assert_eq!(run(&["get", "k", "-w="]).get("write-out"), "=");
        // --help is not a flag yet while the command is looked up: it
        // takes `get` as its value, and the root's help is shown
        assert!(
            matches!(execute(&ctl(), &a(&["--help", "get"])), Outcome::Help(p) if p.is_empty())
        );
        assert!(
            matches!(execute(&ctl(), &a(&["get", "--help"])), Outcome::Help(p) if p == ["get"])
        );
        assert!(matches!(execute(&ctl(), &a(&["lease"])), Outcome::Help(p) if p == ["lease"]));
        let p = run(&["help", "lease", "bogus"]);
        assert_eq!(p.path, ["help"]);
        assert_eq!(find(&ctl(), &p.args).0, ["lease"]);
        // hidden flags work and are not listed
        assert_eq!(run(&["get", "k", "--secret=7"]).u64("secret"), 7);
        assert!(!usage(&ctl(), &["get"]).contains("secret"));
    }

    #[test]
    fn usage_page() {
        assert_eq!(
            usage(&root(), &["snapshot"]),
            "Usage:\n  etcdutl snapshot [command]\n\nAvailable Commands:\n  status      Gets status\n\nFlags:\n  -h, --help   help for snapshot\n\nGlobal Flags:\n  -w, --write-out string   set the output format (default \"simple\")\n\nUse \"etcdutl snapshot [command] --help\" for more information about a command.\n"
        );
    }
}
