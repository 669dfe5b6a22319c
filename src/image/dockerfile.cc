// The Dockerfile parser of template builds (dockerfile.h): physical lines into logical ones
// (directives, comments, continuations), then one Step per instruction, with Docker's word
// splitting and quote removal; and Docker's variable substitution.
#include "image/dockerfile.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/json_util.h"
#include "common/status_util.h"

namespace sbx::image::dockerfile {
namespace {

constexpr size_t kMaxBytes = size_t{1} << 20;
constexpr size_t kMaxSteps = 10000;
constexpr size_t kMaxExpanded = size_t{1} << 20;
constexpr int kMaxExpandDepth = 16;
constexpr char kSupported[] = "supported: FROM RUN COPY ADD ENV WORKDIR USER ARG LABEL CMD ENTRYPOINT";

struct Keyword {
  std::string_view name;
  Kind kind;
};
constexpr Keyword kKeywords[] = {
    {"FROM", Kind::kFrom},   {"RUN", Kind::kRun},         {"COPY", Kind::kCopy},
    {"ADD", Kind::kAdd},     {"ENV", Kind::kEnv},         {"WORKDIR", Kind::kWorkdir},
    {"USER", Kind::kUser},   {"ARG", Kind::kArg},         {"LABEL", Kind::kLabel},
    {"CMD", Kind::kCmd},     {"ENTRYPOINT", Kind::kEntrypoint}};
// Docker's other instructions get a message that says they exist but are not supported here,
// rather than "unknown", which would suggest a typo.
constexpr std::string_view kUnsupported[] = {"EXPOSE",     "VOLUME", "HEALTHCHECK", "ONBUILD",
                                             "STOPSIGNAL", "SHELL",  "MAINTAINER"};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsNameChar(char c) { return IsAlpha(c) || (c >= '0' && c <= '9') || c == '_'; }

std::string_view TrimLeft(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  return s;
}
std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

// Client text quoted in a message: short, and printable ASCII only, because messages end up in
// JSON bodies (nlohmann refuses invalid UTF-8 when it dumps) and in logs.
std::string Show(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (out.size() >= 60) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::Status LineError(int line, std::string_view msg) {
  return absl::InvalidArgumentError(fmt::format("Dockerfile line {}: {}", line, msg));
}

std::string_view Name(Kind k) {
  for (const auto& kw : kKeywords) {
    if (kw.kind == k) return kw.name;
  }
  return "?";
}

// ---- words -------------------------------------------------------------------------------------

// The end of the word that starts at s[i]: whitespace ends it except inside quotes or after the
// escape character. The word keeps its quotes and escapes (Docker's parseWords); Unquote
// removes them.
size_t WordEnd(std::string_view s, size_t i, char esc) {
  char quote = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == esc && quote != '\'' && i + 1 < s.size()) {
      i += 2;
      continue;
    }
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (IsSpace(c)) {
      break;
    } else if (c == '\'' || c == '"') {
      quote = c;
    }
    ++i;
  }
  return i;
}

std::vector<std::string_view> Words(std::string_view s, char esc) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (true) {
    while (i < s.size() && IsSpace(s[i])) ++i;
    if (i == s.size()) break;
    const size_t end = WordEnd(s, i, esc);
    out.push_back(s.substr(i, end - i));
    i = end;
  }
  return out;
}

// Quote removal and escapes as Docker's shell lexer does them, into Expand's syntax: a `$`
// that is literal here (single quotes, escaped) becomes `\$`, so that the build's Expand keeps
// it. Inside double quotes the escape character escapes only `"`, `$` and itself.
absl::StatusOr<std::string> Unquote(std::string_view raw, char esc, int line) {
  std::string out;
  out.reserve(raw.size());
  char quote = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    if (quote == '\'') {
      if (c == '\'') {
        quote = 0;
      } else {
        out += c == '$' ? std::string_view("\\$") : std::string_view(&raw[i], 1);
      }
      continue;
    }
    if (quote == '"' && c == '"') {
      quote = 0;
      continue;
    }
    if (quote == 0 && (c == '\'' || c == '"')) {
      quote = c;
      continue;
    }
    if (c != esc) {
      out.push_back(c);
      continue;
    }
    if (i + 1 == raw.size()) continue;  // an escape with nothing after it escapes nothing
    const char next = raw[i + 1];
    if (quote == '"' && next != '"' && next != '$' && next != esc) {
      out.push_back(c);  // literal inside double quotes
      continue;
    }
    ++i;
    if (next == '$') {
      out += "\\$";
    } else {
      out.push_back(next);
    }
  }
  if (quote != 0) {
    return LineError(line, fmt::format("unterminated {} quote in \"{}\"",
                                       quote == '"' ? "double" : "single", Show(raw)));
  }
  return out;
}

// ---- parts of instructions ---------------------------------------------------------------------

struct Flag {
  std::string_view name;
  std::optional<std::string_view> value;  // after '='
};

// Takes the leading --name[=value] words off `rest`, as Docker does for every instruction; a
// bare `--` ends them.
std::vector<Flag> TakeFlags(std::string_view& rest, char esc) {
  std::vector<Flag> flags;
  size_t i = 0;
  while (true) {
    while (i < rest.size() && IsSpace(rest[i])) ++i;
    if (rest.substr(i, 2) != "--") break;
    const size_t end = WordEnd(rest, i, esc);
    const std::string_view word = rest.substr(i + 2, end - i - 2);
    i = end;
    if (word.empty()) break;
    const size_t eq = word.find('=');
    if (eq == std::string_view::npos) {
      flags.push_back({word, std::nullopt});
    } else {
      flags.push_back({word.substr(0, eq), word.substr(eq + 1)});
    }
  }
  rest = TrimRight(TrimLeft(rest.substr(i)));
  return flags;
}

std::optional<uint32_t> ParseOctal(std::string_view s) {
  if (s.empty() || s.size() > 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '7') return std::nullopt;
    v = v * 8 + static_cast<uint32_t>(c - '0');
  }
  if (v > 07777) return std::nullopt;
  return v;
}

absl::Status ApplyFlags(const std::vector<Flag>& flags, char esc, Step& step) {
  const bool copy = step.kind == Kind::kCopy || step.kind == Kind::kAdd;
  bool seen_chown = false;
  for (const Flag& f : flags) {
    if (step.kind == Kind::kCopy && f.name == "from") {
      return LineError(step.line, "COPY --from: multi-stage builds are not supported");
    }
    if (!copy || (f.name != "chown" && f.name != "chmod")) {
      return LineError(step.line, fmt::format("unknown flag --{} on {} (only COPY and ADD take "
                                              "flags: --chown=USER[:GROUP] and --chmod=OCTAL)",
                                              Show(f.name), Name(step.kind)));
    }
    const bool chown = f.name == "chown";
    if (chown ? seen_chown : step.chmod.has_value()) {
      return LineError(step.line, fmt::format("--{} given twice", f.name));
    }
    std::string value;
    if (f.value) {
      SBX_ASSIGN_OR_RETURN(value, Unquote(*f.value, esc, step.line));
    }
    if (value.empty()) {
      return LineError(step.line, chown ? "--chown needs a value: --chown=USER[:GROUP]"
                                        : "--chmod needs a value: --chmod=OCTAL");
    }
    if (chown) {
      seen_chown = true;
      step.chown = std::move(value);
      continue;
    }
    step.chmod = ParseOctal(value);
    if (!step.chmod) {
      return LineError(step.line, fmt::format("--chmod={}: not an octal mode from 0 to 7777",
                                              Show(value)));
    }
  }
  return absl::OkStatus();
}

using StringList = std::optional<std::vector<std::string>>;

// An exec form: a JSON array of strings. nullopt when `rest` is not a JSON array, which makes it
// shell form (or whitespace-separated words), as in Docker; an error for an array holding
// anything but strings, which Docker refuses too.
absl::StatusOr<StringList> JsonForm(std::string_view rest, const Step& step) {
  if (rest.empty() || rest.front() != '[') return StringList();
  auto j = ParseUntrustedJson(rest);
  if (!j.ok() || !j->is_array()) return StringList();
  std::vector<std::string> out;
  out.reserve(j->size());
  for (const auto& v : *j) {
    if (!v.is_string()) {
      return LineError(step.line, fmt::format("{}: the exec form must be a JSON array of strings",
                                              Name(step.kind)));
    }
    out.push_back(v.get<std::string>());
  }
  return StringList(std::move(out));
}

// ---- instructions ------------------------------------------------------------------------------

absl::Status ParseFrom(std::string_view rest, char esc, Step& step) {
  const auto words = Words(rest, esc);
  if (words.size() == 3 && Upper(words[1]) == "AS") {
    return LineError(step.line, "FROM ... AS name: multi-stage builds are not supported");
  }
  if (words.size() != 1) {
    return LineError(step.line, "FROM takes one image: FROM IMAGE[:TAG]");
  }
  SBX_ASSIGN_OR_RETURN(step.value, Unquote(words[0], esc, step.line));
  return absl::OkStatus();
}

absl::Status ParseCommand(std::string_view rest, Step& step) {
  SBX_ASSIGN_OR_RETURN(StringList exec, JsonForm(rest, step));
  if (exec) {
    if (exec->empty() && step.kind == Kind::kRun) {
      return LineError(step.line, "RUN [] has no command");
    }
    step.args = std::move(*exec);
    return absl::OkStatus();
  }
  step.args = {"/bin/sh", "-c", std::string(rest)};
  step.shell_form = true;
  return absl::OkStatus();
}

absl::Status ParseCopy(std::string_view rest, char esc, Step& step) {
  SBX_ASSIGN_OR_RETURN(StringList paths, JsonForm(rest, step));
  if (!paths) {
    paths.emplace();
    for (std::string_view w : Words(rest, esc)) {
      SBX_ASSIGN_OR_RETURN(std::string p, Unquote(w, esc, step.line));
      paths->push_back(std::move(p));
    }
  }
  if (paths->size() < 2) {
    return LineError(step.line, fmt::format("{} needs a source and a destination: {} SRC... DEST",
                                            Name(step.kind), Name(step.kind)));
  }
  for (const auto& p : *paths) {
    if (p.empty()) return LineError(step.line, fmt::format("{}: an empty path", Name(step.kind)));
  }
  step.dest = std::move(paths->back());
  paths->pop_back();
  step.sources = std::move(*paths);
  return absl::OkStatus();
}

// ENV and LABEL: `NAME=VALUE...`, or the legacy `NAME VALUE WITH SPACES`; which one is told by
// whether the first word holds a '=' (Docker's parseNameVal).
absl::Status ParsePairs(std::string_view rest, char esc, Step& step) {
  const auto words = Words(rest, esc);
  const std::string_view what = Name(step.kind);
  if (words[0].find('=') == std::string_view::npos) {
    const std::string_view value = TrimLeft(rest.substr(words[0].size()));
    if (words.size() < 2) {
      return LineError(step.line, fmt::format("{} {} needs a value: {} NAME=VALUE or {} NAME VALUE",
                                              what, Show(words[0]), what, what));
    }
    SBX_ASSIGN_OR_RETURN(std::string k, Unquote(words[0], esc, step.line));
    SBX_ASSIGN_OR_RETURN(std::string v, Unquote(value, esc, step.line));
    step.pairs.emplace_back(std::move(k), std::move(v));
    return absl::OkStatus();
  }
  for (std::string_view w : words) {
    const size_t eq = w.find('=');
    if (eq == std::string_view::npos) {
      return LineError(step.line, fmt::format("{}: no '=' in \"{}\" (write NAME=VALUE)", what,
                                              Show(w)));
    }
    SBX_ASSIGN_OR_RETURN(std::string k, Unquote(w.substr(0, eq), esc, step.line));
    if (k.empty()) return LineError(step.line, fmt::format("{}: a name is empty", what));
    SBX_ASSIGN_OR_RETURN(std::string v, Unquote(w.substr(eq + 1), esc, step.line));
    step.pairs.emplace_back(std::move(k), std::move(v));
  }
  return absl::OkStatus();
}

absl::Status ParseArg(std::string_view rest, char esc, Step& step) {
  const auto words = Words(rest, esc);
  if (words.size() != 1) {
    return LineError(step.line, "ARG takes one NAME[=DEFAULT] (write one ARG per line)");
  }
  const size_t eq = words[0].find('=');
  SBX_ASSIGN_OR_RETURN(std::string name, Unquote(words[0].substr(0, eq), esc, step.line));
  if (name.empty()) return LineError(step.line, "ARG: the name is empty");
  std::string value;
  if (eq != std::string_view::npos) {
    SBX_ASSIGN_OR_RETURN(value, Unquote(words[0].substr(eq + 1), esc, step.line));
    step.has_default = true;
  }
  step.pairs.emplace_back(std::move(name), std::move(value));
  return absl::OkStatus();
}

absl::StatusOr<Kind> KindOf(std::string_view keyword, int line) {
  const std::string up = Upper(keyword);
  for (const auto& kw : kKeywords) {
    if (kw.name == up) return kw.kind;
  }
  for (std::string_view u : kUnsupported) {
    if (u == up) {
      return LineError(line, fmt::format("{} is not supported in template builds ({})", u,
                                         kSupported));
    }
  }
  return LineError(line, fmt::format("unknown instruction \"{}\" ({})", Show(keyword), kSupported));
}

// One logical line (continuations joined, trimmed, not empty) into a step of `out`.
absl::Status AddInstruction(int line, std::string text, char esc, Dockerfile& out) {
  if (out.args_before_from.size() + out.steps.size() >= kMaxSteps) {
    return LineError(line, fmt::format("more than {} instructions", kMaxSteps));
  }
  size_t kw_end = 0;
  while (kw_end < text.size() && !IsSpace(text[kw_end])) ++kw_end;
  SBX_ASSIGN_OR_RETURN(Kind kind, KindOf(std::string_view(text).substr(0, kw_end), line));
  Step step{.kind = kind, .line = line};
  const bool have_from = !out.steps.empty();
  if (kind == Kind::kFrom && have_from) {
    return LineError(line, "a second FROM: multi-stage builds are not supported");
  }
  if (!have_from && kind != Kind::kFrom && kind != Kind::kArg) {
    return LineError(line, fmt::format("{} before FROM (only ARG may come before FROM)", Name(kind)));
  }
  std::string_view rest = std::string_view(text).substr(kw_end);
  const std::vector<Flag> flags = TakeFlags(rest, esc);
  SBX_RETURN_IF_ERROR(ApplyFlags(flags, esc, step));
  if (rest.empty()) return LineError(line, fmt::format("{} needs an argument", Name(kind)));
  switch (kind) {
    case Kind::kFrom:
      SBX_RETURN_IF_ERROR(ParseFrom(rest, esc, step));
      break;
    case Kind::kRun:
    case Kind::kCmd:
    case Kind::kEntrypoint:
      SBX_RETURN_IF_ERROR(ParseCommand(rest, step));
      break;
    case Kind::kCopy:
    case Kind::kAdd:
      SBX_RETURN_IF_ERROR(ParseCopy(rest, esc, step));
      break;
    case Kind::kEnv:
    case Kind::kLabel:
      SBX_RETURN_IF_ERROR(ParsePairs(rest, esc, step));
      break;
    case Kind::kArg:
      SBX_RETURN_IF_ERROR(ParseArg(rest, esc, step));
      break;
    case Kind::kWorkdir:
    case Kind::kUser: {
      SBX_ASSIGN_OR_RETURN(step.value, Unquote(rest, esc, line));
      if (step.value.empty()) return LineError(line, fmt::format("{} needs an argument", Name(kind)));
      break;
    }
  }
  step.text = std::move(text);
  (have_from || kind == Kind::kFrom ? out.steps : out.args_before_from).push_back(std::move(step));
  return absl::OkStatus();
}

// ---- lines -------------------------------------------------------------------------------------

struct Directive {
  std::string name;  // lower case
  std::string_view value;
};

// "# name=value" (Docker's directive syntax); anything else ends the directives.
std::optional<Directive> ParseDirective(std::string_view line) {
  if (line.empty() || line.front() != '#') return std::nullopt;
  std::string_view s = TrimLeft(line.substr(1));
  size_t i = 0;
  while (i < s.size() && (IsAlpha(s[i]) || (i > 0 && s[i] >= '0' && s[i] <= '9'))) ++i;
  if (i == 0) return std::nullopt;
  Directive d{std::string(s.substr(0, i)), {}};
  for (auto& c : d.name) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  s = TrimLeft(s.substr(i));
  if (s.empty() || s.front() != '=') return std::nullopt;
  d.value = TrimRight(TrimLeft(s.substr(1)));
  if (d.value.empty()) return std::nullopt;
  // Docker ends the directives at an unknown one, which is then a comment.
  if (d.name != "syntax" && d.name != "escape" && d.name != "check") return std::nullopt;
  return d;
}

}  // namespace

absl::StatusOr<Dockerfile> Parse(std::string_view text) {
  if (text.size() > kMaxBytes) return absl::InvalidArgumentError("Dockerfile: larger than 1 MiB");
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte order mark
  Dockerfile out;
  char esc = '\\';
  bool in_directives = true;
  std::vector<std::string> seen_directives;
  std::string logical;  // the instruction being joined
  int start = 0;        // its first line; 0 when there is none
  int n = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++n;
    if (line.ends_with('\r')) line.remove_suffix(1);
    line = TrimLeft(line);
    if (in_directives) {
      if (auto d = ParseDirective(line)) {
        for (const auto& s : seen_directives) {
          if (s == d->name) return LineError(n, fmt::format("a second {} directive", d->name));
        }
        seen_directives.push_back(d->name);
        if (d->name == "escape") {
          if (d->value != "\\" && d->value != "`") {
            return LineError(n, fmt::format("the escape directive takes \\ or ` (not \"{}\")",
                                            Show(d->value)));
          }
          esc = d->value.front();
        }
        continue;
      }
      in_directives = false;
    }
    // Comment lines and blank lines are dropped, also inside a continuation (as Docker does).
    if (line.starts_with('#')) continue;
    std::string_view seg = TrimRight(line);
    if (seg.empty()) continue;
    const bool more = seg.back() == esc;
    if (more) seg = TrimRight(seg.substr(0, seg.size() - 1));
    if (start == 0) start = n;
    if (!logical.empty() && !seg.empty()) logical.push_back(' ');
    logical.append(seg);
    if (more) continue;
    if (!logical.empty()) SBX_RETURN_IF_ERROR(AddInstruction(start, std::move(logical), esc, out));
    logical.clear();
    start = 0;
  }
  // A continuation on the last line ends the instruction there.
  if (!logical.empty()) SBX_RETURN_IF_ERROR(AddInstruction(start, std::move(logical), esc, out));
  if (out.steps.empty()) {
    return absl::InvalidArgumentError(out.args_before_from.empty() ? "Dockerfile: empty"
                                                                   : "Dockerfile: no FROM");
  }
  return out;
}

// ---- substitution ------------------------------------------------------------------------------

namespace {

// The '}' that closes a "${" whose body starts at w[i], past nested ones and escaped characters.
size_t ClosingBrace(std::string_view w, size_t i) {
  int depth = 0;
  for (; i < w.size(); ++i) {
    if (w[i] == '\\' && i + 1 < w.size()) {
      ++i;
    } else if (w[i] == '$' && i + 1 < w.size() && w[i + 1] == '{') {
      ++depth;
      ++i;
    } else if (w[i] == '}') {
      if (depth == 0) return i;
      --depth;
    }
  }
  return std::string_view::npos;
}

class Expander {
 public:
  Expander(std::string_view whole, const std::map<std::string, std::string>& vars)
      : whole_(whole), vars_(vars) {}

  absl::Status Run(std::string_view w, int depth, std::string& out) const {
    if (depth > kMaxExpandDepth) return Bad(fmt::format(" (nested more than {} deep)", kMaxExpandDepth));
    size_t i = 0;
    while (i < w.size()) {
      if (w[i] == '\\' && i + 1 < w.size() && w[i + 1] == '$') {
        out.push_back('$');
        i += 2;
      } else if (w[i] != '$' || i + 1 == w.size()) {
        out.push_back(w[i++]);
      } else if (w[i + 1] == '{') {
        const size_t close = ClosingBrace(w, i + 2);
        if (close == std::string_view::npos) return Bad("");
        SBX_RETURN_IF_ERROR(Braced(w.substr(i + 2, close - i - 2), depth, out));
        i = close + 1;
      } else if (IsNameChar(w[i + 1])) {
        size_t j = i + 1;
        while (j < w.size() && IsNameChar(w[j])) ++j;
        if (auto it = vars_.find(std::string(w.substr(i + 1, j - i - 1))); it != vars_.end()) {
          out += it->second;
        }
        i = j;
      } else {
        out.push_back(w[i++]);  // "$" before anything else is a literal "$", as in Docker
      }
      if (out.size() > kMaxExpanded) {
        return absl::InvalidArgumentError(fmt::format(
            "variable substitution in \"{}\" gives more than 1 MiB", Show(whole_)));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Bad(std::string_view why) const {
    return absl::InvalidArgumentError(
        fmt::format("bad variable substitution in \"{}\"{}", Show(whole_), why));
  }

  // The inside of ${...}: NAME, then nothing or one of :- :+ - + and a word.
  absl::Status Braced(std::string_view body, int depth, std::string& out) const {
    size_t j = 0;
    while (j < body.size() && IsNameChar(body[j])) ++j;
    if (j == 0) return Bad("");
    const auto it = vars_.find(std::string(body.substr(0, j)));
    std::string_view op = body.substr(j);
    if (op.empty()) {
      if (it != vars_.end()) out += it->second;
      return absl::OkStatus();
    }
    const bool colon = op.front() == ':';
    if (colon) op.remove_prefix(1);
    if (op.empty() || (op.front() != '-' && op.front() != '+')) return Bad("");
    const bool set = it != vars_.end() && (!colon || !it->second.empty());
    const std::string_view word = op.substr(1);
    if (op.front() == '-') {
      if (set) {
        out += it->second;
        return absl::OkStatus();
      }
      return Run(word, depth + 1, out);
    }
    return set ? Run(word, depth + 1, out) : absl::OkStatus();
  }

  std::string_view whole_;
  const std::map<std::string, std::string>& vars_;
};

}  // namespace

absl::StatusOr<std::string> Expand(std::string_view word,
                                   const std::map<std::string, std::string>& vars) {
  std::string out;
  SBX_RETURN_IF_ERROR(Expander(word, vars).Run(word, 0, out));
  return out;
}

}  // namespace sbx::image::dockerfile
