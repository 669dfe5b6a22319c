// The Dockerfile parser of template builds and its variable substitution (dockerfile.h): every
// instruction in both forms, Docker's lexical rules, and each error with the line it names.
#include "image/dockerfile.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sbx::image::dockerfile {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;
using Pairs = std::vector<std::pair<std::string, std::string>>;

Dockerfile Ok(std::string_view text) {
  auto d = Parse(text);
  EXPECT_TRUE(d.ok()) << d.status() << "\n" << text;
  return d.ok() ? *std::move(d) : Dockerfile{};
}

// The one step after FROM.
Step Only(std::string_view instruction) {
  Dockerfile d = Ok("FROM x\n" + std::string(instruction) + "\n");
  EXPECT_EQ(d.steps.size(), 2u) << instruction;
  return d.steps.size() == 2 ? d.steps[1] : Step{};
}

std::string Error(std::string_view text) {
  auto d = Parse(text);
  EXPECT_FALSE(d.ok()) << text;
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
  return std::string(d.status().message());
}

TEST(ParseTest, EveryInstruction) {
  Dockerfile d = Ok(R"(ARG BASE=debian:12
FROM ${BASE}
RUN apt-get update
COPY a /b
ADD c.tar /d
ENV A=1
WORKDIR /w
USER app
ARG V
LABEL k=v
CMD ["app"]
ENTRYPOINT ["tini", "--"]
)");
  ASSERT_EQ(d.args_before_from.size(), 1u);
  EXPECT_EQ(d.args_before_from[0].kind, Kind::kArg);
  EXPECT_EQ(d.args_before_from[0].line, 1);
  EXPECT_THAT(d.args_before_from[0].pairs, ElementsAre(Pair("BASE", "debian:12")));
  std::vector<Kind> kinds;
  std::vector<int> lines;
  for (const auto& s : d.steps) {
    kinds.push_back(s.kind);
    lines.push_back(s.line);
  }
  EXPECT_THAT(kinds, ElementsAre(Kind::kFrom, Kind::kRun, Kind::kCopy, Kind::kAdd, Kind::kEnv,
                                 Kind::kWorkdir, Kind::kUser, Kind::kArg, Kind::kLabel, Kind::kCmd,
                                 Kind::kEntrypoint));
  EXPECT_THAT(lines, ElementsAre(2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12));
  EXPECT_EQ(d.steps[0].value, "${BASE}");
  EXPECT_EQ(d.steps[0].text, "FROM ${BASE}");
  EXPECT_EQ(d.steps[5].value, "/w");
  EXPECT_EQ(d.steps[6].value, "app");
  EXPECT_THAT(d.steps[10].args, ElementsAre("tini", "--"));
}

TEST(ParseTest, KeywordsAnyCaseAndLeadingWhitespace) {
  Dockerfile d = Ok("  from x\n\trun echo hi\n   Workdir /a\n");
  ASSERT_EQ(d.steps.size(), 3u);
  EXPECT_EQ(d.steps[0].kind, Kind::kFrom);
  EXPECT_EQ(d.steps[1].kind, Kind::kRun);
  EXPECT_EQ(d.steps[1].text, "run echo hi");  // as written
  EXPECT_EQ(d.steps[2].kind, Kind::kWorkdir);
}

TEST(ParseTest, FromTakesOneImage) {
  EXPECT_EQ(Ok("FROM registry.example:5000/a/b:1@sha256:00").steps[0].value,
            "registry.example:5000/a/b:1@sha256:00");
  EXPECT_EQ(Ok("FROM \"x\"").steps[0].value, "x");
  EXPECT_THAT(Error("FROM a b"), StartsWith("Dockerfile line 1: FROM takes one image"));
}

TEST(ParseTest, RunShellAndExecForms) {
  Step s = Only("RUN echo \"a  b\" && ls -l $HOME");
  EXPECT_TRUE(s.shell_form);
  EXPECT_THAT(s.args, ElementsAre("/bin/sh", "-c", "echo \"a  b\" && ls -l $HOME"));
  s = Only(R"(RUN ["/bin/echo", "a b", "$HOME", "q\"x"])");
  EXPECT_FALSE(s.shell_form);
  EXPECT_THAT(s.args, ElementsAre("/bin/echo", "a b", "$HOME", "q\"x"));
  s = Only("RUN   [ \"ls\" ]  ");
  EXPECT_FALSE(s.shell_form);
  EXPECT_THAT(s.args, ElementsAre("ls"));
}

TEST(ParseTest, InvalidJsonIsShellForm) {
  for (const char* line : {"RUN [ -f /x ] && echo y", "RUN [\"a\",", "CMD ['single']",
                           "ENTRYPOINT [\"a\"] trailing"}) {
    Step s = Only(line);
    EXPECT_TRUE(s.shell_form) << line;
    ASSERT_EQ(s.args.size(), 3u) << line;
    EXPECT_EQ(s.args[2], std::string_view(line).substr(std::string_view(line).find(' ') + 1));
  }
}

TEST(ParseTest, CmdAndEntrypoint) {
  Step s = Only("CMD python app.py");
  EXPECT_EQ(s.kind, Kind::kCmd);
  EXPECT_TRUE(s.shell_form);
  EXPECT_THAT(s.args, ElementsAre("/bin/sh", "-c", "python app.py"));
  s = Only("CMD []");  // clears the image's CMD
  EXPECT_FALSE(s.shell_form);
  EXPECT_TRUE(s.args.empty());
  s = Only("ENTRYPOINT [\"/entry.sh\"]");
  EXPECT_EQ(s.kind, Kind::kEntrypoint);
  EXPECT_THAT(s.args, ElementsAre("/entry.sh"));
  s = Only("entrypoint exec /entry.sh");
  EXPECT_TRUE(s.shell_form);
  EXPECT_THAT(s.args, ElementsAre("/bin/sh", "-c", "exec /entry.sh"));
}

TEST(ParseTest, Continuations) {
  Dockerfile d = Ok("FROM x\n"
                    "RUN apt-get update && \\\n"
                    "    # a comment inside the continuation\n"
                    "\n"
                    "    apt-get install -y \\  \n"
                    "      curl\n"
                    "USER app\n");
  ASSERT_EQ(d.steps.size(), 3u);
  EXPECT_EQ(d.steps[1].line, 2);
  EXPECT_EQ(d.steps[1].text, "RUN apt-get update && apt-get install -y curl");
  EXPECT_THAT(d.steps[1].args, ElementsAre("/bin/sh", "-c", "apt-get update && apt-get install -y curl"));
  EXPECT_EQ(d.steps[2].line, 7);
}

TEST(ParseTest, ContinuationAtTheEndOfTheFile) {
  Dockerfile d = Ok("FROM x\nRUN echo a \\\n  b \\");
  ASSERT_EQ(d.steps.size(), 2u);
  EXPECT_EQ(d.steps[1].text, "RUN echo a b");
  d = Ok("FROM x\nRUN echo \\\n");
  EXPECT_EQ(d.steps[1].text, "RUN echo");
}

TEST(ParseTest, CommentsAndBlankLines) {
  Dockerfile d = Ok("# leading comment\n\n  # indented comment\nFROM x\n\nRUN echo # not a comment\n");
  ASSERT_EQ(d.steps.size(), 2u);
  EXPECT_EQ(d.steps[0].line, 4);
  EXPECT_EQ(d.steps[1].line, 6);
  EXPECT_EQ(d.steps[1].args[2], "echo # not a comment");
}

TEST(ParseTest, CrLf) {
  Dockerfile d = Ok("FROM x\r\nRUN a \\\r\n b\r\nENV K=v\r\n\r\nWORKDIR /w\r\n");
  ASSERT_EQ(d.steps.size(), 4u);
  EXPECT_EQ(d.steps[1].args[2], "a b");
  EXPECT_THAT(d.steps[2].pairs, ElementsAre(Pair("K", "v")));
  EXPECT_EQ(d.steps[3].value, "/w");
  EXPECT_EQ(d.steps[3].line, 6);
}

TEST(ParseTest, EnvNameEqualsValue) {
  Step s = Only(R"(ENV A=1 B="two words" C='single $x' D=a\ b E="q\"uote" F= G="x\y")");
  EXPECT_EQ(s.kind, Kind::kEnv);
  EXPECT_THAT(s.pairs, ElementsAre(Pair("A", "1"), Pair("B", "two words"), Pair("C", "single \\$x"),
                                   Pair("D", "a b"), Pair("E", "q\"uote"), Pair("F", ""),
                                   Pair("G", "x\\y")));
}

TEST(ParseTest, EnvLegacyForm) {
  EXPECT_THAT(Only("ENV MSG hello  big world").pairs, ElementsAre(Pair("MSG", "hello  big world")));
  EXPECT_THAT(Only("ENV MSG \"quoted\" and\\ escaped").pairs,
              ElementsAre(Pair("MSG", "quoted and escaped")));
}

TEST(ParseTest, EnvKeepsVariablesForExpand) {
  Step s = Only(R"(ENV PATH=$PATH:/opt/bin HOME_="${HOME}" LIT=\$HOME Q="\$HOME")");
  EXPECT_THAT(s.pairs, ElementsAre(Pair("PATH", "$PATH:/opt/bin"), Pair("HOME_", "${HOME}"),
                                   Pair("LIT", "\\$HOME"), Pair("Q", "\\$HOME")));
  std::map<std::string, std::string> vars = {{"PATH", "/bin"}, {"HOME", "/root"}};
  EXPECT_EQ(*Expand(s.pairs[0].second, vars), "/bin:/opt/bin");
  EXPECT_EQ(*Expand(s.pairs[1].second, vars), "/root");
  EXPECT_EQ(*Expand(s.pairs[2].second, vars), "$HOME");
  EXPECT_EQ(*Expand(s.pairs[3].second, vars), "$HOME");
}

TEST(ParseTest, EnvErrors) {
  EXPECT_THAT(Error("FROM x\nENV A=1 B"), StartsWith("Dockerfile line 2: ENV: no '=' in \"B\""));
  EXPECT_THAT(Error("FROM x\nENV ONLY"), StartsWith("Dockerfile line 2: ENV ONLY needs a value"));
  EXPECT_THAT(Error("FROM x\n\nENV =v"), StartsWith("Dockerfile line 3: ENV: a name is empty"));
}

TEST(ParseTest, Label) {
  Step s = Only(R"(LABEL org.opencontainers.image.title="My app" "quoted key"=v version=1.0)");
  EXPECT_EQ(s.kind, Kind::kLabel);
  EXPECT_THAT(s.pairs, ElementsAre(Pair("org.opencontainers.image.title", "My app"),
                                   Pair("quoted key", "v"), Pair("version", "1.0")));
  EXPECT_THAT(Only("LABEL maintainer someone <a@b>").pairs,
              ElementsAre(Pair("maintainer", "someone <a@b>")));
}

TEST(ParseTest, Arg) {
  Step s = Only("ARG VERSION");
  EXPECT_THAT(s.pairs, ElementsAre(Pair("VERSION", "")));
  EXPECT_FALSE(s.has_default);
  s = Only("ARG VERSION=1.2");
  EXPECT_THAT(s.pairs, ElementsAre(Pair("VERSION", "1.2")));
  EXPECT_TRUE(s.has_default);
  s = Only("ARG EMPTY=");
  EXPECT_THAT(s.pairs, ElementsAre(Pair("EMPTY", "")));
  EXPECT_TRUE(s.has_default);
  s = Only("ARG MSG=\"a b\"");
  EXPECT_THAT(s.pairs, ElementsAre(Pair("MSG", "a b")));
  EXPECT_THAT(Error("FROM x\nARG A B"), StartsWith("Dockerfile line 2: ARG takes one NAME"));
  EXPECT_THAT(Error("FROM x\nARG =1"), StartsWith("Dockerfile line 2: ARG: the name is empty"));
}

TEST(ParseTest, ArgsBeforeFrom) {
  Dockerfile d = Ok("ARG A=1\n# c\nARG B\nFROM img:${A}\nARG A\n");
  ASSERT_EQ(d.args_before_from.size(), 2u);
  EXPECT_EQ(d.args_before_from[1].line, 3);
  ASSERT_EQ(d.steps.size(), 2u);
  EXPECT_EQ(d.steps[1].kind, Kind::kArg);
}

TEST(ParseTest, CopyAndAdd) {
  Step s = Only("COPY a b/ c* /dst/");
  EXPECT_EQ(s.kind, Kind::kCopy);
  EXPECT_THAT(s.sources, ElementsAre("a", "b/", "c*"));
  EXPECT_EQ(s.dest, "/dst/");
  EXPECT_EQ(s.chown, "");
  EXPECT_FALSE(s.chmod.has_value());
  s = Only("COPY --chown=app:staff --chmod=755 src /dst");
  EXPECT_EQ(s.chown, "app:staff");
  EXPECT_EQ(s.chmod, 0755u);
  EXPECT_THAT(s.sources, ElementsAre("src"));
  s = Only("COPY --chmod=0644 -- --weird /dst");  // "--" ends the flags
  EXPECT_EQ(s.chmod, 0644u);
  EXPECT_THAT(s.sources, ElementsAre("--weird"));
  s = Only(R"(COPY --chown=1000 ["a file", "$SRC", "/d st/"])");
  EXPECT_EQ(s.chown, "1000");
  EXPECT_THAT(s.sources, ElementsAre("a file", "$SRC"));
  EXPECT_EQ(s.dest, "/d st/");
  s = Only("COPY \"with space\" 'it''s' /d");
  EXPECT_THAT(s.sources, ElementsAre("with space", "its"));
  s = Only("ADD --chmod=600 https://example.com/x.tgz /opt/");
  EXPECT_EQ(s.kind, Kind::kAdd);
  EXPECT_EQ(s.chmod, 0600u);
  EXPECT_THAT(s.sources, ElementsAre("https://example.com/x.tgz"));
  EXPECT_EQ(s.dest, "/opt/");
}

TEST(ParseTest, CopyErrors) {
  EXPECT_THAT(Error("FROM x\nCOPY only"),
              StartsWith("Dockerfile line 2: COPY needs a source and a destination"));
  EXPECT_THAT(Error("FROM x\nCOPY --chmod=8 a b"), StartsWith("Dockerfile line 2: --chmod=8"));
  EXPECT_THAT(Error("FROM x\nCOPY --chmod=u+x a b"), HasSubstr("not an octal mode"));
  EXPECT_THAT(Error("FROM x\nCOPY --chmod=17777 a b"), HasSubstr("not an octal mode"));
  EXPECT_THAT(Error("FROM x\nADD --chown a b"), StartsWith("Dockerfile line 2: --chown needs a value"));
  EXPECT_THAT(Error("FROM x\nCOPY --chown=a --chown=b a b"), HasSubstr("--chown given twice"));
  EXPECT_THAT(Error("FROM x\nCOPY [\"a\", 1] "),
              StartsWith("Dockerfile line 2: COPY: the exec form must be a JSON array of strings"));
  EXPECT_THAT(Error("FROM x\nCOPY [\"\", \"/d\"]"), HasSubstr("an empty path"));
}

TEST(ParseTest, EscapeDirective) {
  Dockerfile d = Ok("# escape=`\n"
                    "FROM x\n"
                    "RUN echo C:\\dir `\n"
                    "    next\n"
                    "ENV A=`$lit B=\"q`\"\" C=a`b\n"
                    "WORKDIR C:\\work\n");
  ASSERT_EQ(d.steps.size(), 4u);
  EXPECT_EQ(d.steps[0].line, 2);
  EXPECT_EQ(d.steps[1].args[2], "echo C:\\dir next");
  EXPECT_THAT(d.steps[2].pairs, ElementsAre(Pair("A", "\\$lit"), Pair("B", "q\""), Pair("C", "ab")));
  EXPECT_EQ(d.steps[3].value, "C:\\work");
  // With the default escape a trailing backtick is just a character.
  d = Ok("FROM x\nRUN echo `\nUSER a\n");
  EXPECT_EQ(d.steps[1].args[2], "echo `");
}

TEST(ParseTest, Directives) {
  Dockerfile d = Ok("# syntax=docker/dockerfile:1\n#ESCAPE = \\\nFROM x\n");
  EXPECT_EQ(d.steps[0].line, 3);
  // Once something else came, a directive is a comment.
  d = Ok("# a comment\n# escape=`\nFROM x\nRUN a \\\n b\n");
  EXPECT_EQ(d.steps[1].args[2], "a b");
  d = Ok("FROM x\n# escape=`\n");
  EXPECT_EQ(d.steps.size(), 1u);
  EXPECT_THAT(Error("# escape=x\nFROM x"),
              StartsWith("Dockerfile line 1: the escape directive takes \\ or `"));
  EXPECT_THAT(Error("# escape=`\n# escape=\\\nFROM x"),
              StartsWith("Dockerfile line 2: a second escape directive"));
}

TEST(ParseTest, ByteOrderMark) { EXPECT_EQ(Ok("\xEF\xBB\xBF" "FROM x\n").steps.size(), 1u); }

TEST(ParseTest, UnknownAndUnsupportedInstructions) {
  std::string m = Error("FROM x\nRUN a\n\nFOO bar\n");
  EXPECT_THAT(m, StartsWith("Dockerfile line 4: unknown instruction \"FOO\""));
  EXPECT_THAT(m, HasSubstr("FROM RUN COPY ADD ENV WORKDIR USER ARG LABEL CMD ENTRYPOINT"));
  m = Error("FROM x\nexpose 80\n");
  EXPECT_THAT(m, StartsWith("Dockerfile line 2: EXPOSE is not supported"));
  EXPECT_THAT(m, HasSubstr("FROM RUN COPY ADD ENV WORKDIR USER ARG LABEL CMD ENTRYPOINT"));
  EXPECT_THAT(Error("FROM x\nHEALTHCHECK NONE"), StartsWith("Dockerfile line 2: HEALTHCHECK is not supported"));
  // Unprintable bytes are not copied into the message.
  EXPECT_THAT(Error("FROM x\n\x01\xff x"), HasSubstr("\"\\x01\\xff\""));
}

TEST(ParseTest, MultiStageIsRefused) {
  EXPECT_THAT(Error("FROM a AS build\nRUN make\n"),
              StartsWith("Dockerfile line 1: FROM ... AS name: multi-stage builds are not supported"));
  EXPECT_THAT(Error("FROM a\nRUN make\n\nFROM b\n"),
              StartsWith("Dockerfile line 4: a second FROM: multi-stage builds are not supported"));
  EXPECT_THAT(Error("FROM a\nCOPY --from=build /a /b\n"),
              StartsWith("Dockerfile line 2: COPY --from: multi-stage builds are not supported"));
}

TEST(ParseTest, UnknownFlags) {
  EXPECT_THAT(Error("FROM a\nRUN --mount=type=cache,target=/c make\n"),
              StartsWith("Dockerfile line 2: unknown flag --mount on RUN"));
  EXPECT_THAT(Error("FROM --platform=linux/amd64 a\n"),
              StartsWith("Dockerfile line 1: unknown flag --platform on FROM"));
  EXPECT_THAT(Error("FROM a\nCOPY --link a b\n"), StartsWith("Dockerfile line 2: unknown flag --link on COPY"));
  EXPECT_THAT(Error("FROM a\nADD --checksum=sha256:00 a b\n"),
              StartsWith("Dockerfile line 2: unknown flag --checksum on ADD"));
}

TEST(ParseTest, InstructionBeforeFrom) {
  EXPECT_THAT(Error("ARG A\nRUN x\nFROM a\n"),
              StartsWith("Dockerfile line 2: RUN before FROM (only ARG may come before FROM)"));
  EXPECT_THAT(Error("# c\nENV A=1\nFROM a\n"), StartsWith("Dockerfile line 2: ENV before FROM"));
}

TEST(ParseTest, MissingArguments) {
  for (const char* kw : {"RUN", "CMD", "ENTRYPOINT", "COPY", "ADD", "ENV", "WORKDIR", "USER",
                         "ARG", "LABEL"}) {
    EXPECT_EQ(Error(std::string("FROM a\n\n") + kw + "  \n"),
              fmt::format("Dockerfile line 3: {} needs an argument", kw));
  }
  EXPECT_EQ(Error("FROM\n"), "Dockerfile line 1: FROM needs an argument");
  EXPECT_EQ(Error("FROM a\nRUN \\\n\n"), "Dockerfile line 2: RUN needs an argument");
  EXPECT_THAT(Error("FROM a\nWORKDIR \"\"\n"), StartsWith("Dockerfile line 2: WORKDIR needs an argument"));
  EXPECT_THAT(Error("FROM a\nRUN []\n"), StartsWith("Dockerfile line 2: RUN [] has no command"));
}

TEST(ParseTest, BadJsonArray) {
  EXPECT_THAT(Error("FROM a\nRUN [\"a\", 1]\n"),
              StartsWith("Dockerfile line 2: RUN: the exec form must be a JSON array of strings"));
  EXPECT_THAT(Error("FROM a\nCMD [[\"a\"]]\n"),
              StartsWith("Dockerfile line 2: CMD: the exec form must be a JSON array of strings"));
}

TEST(ParseTest, UnterminatedQuotes) {
  EXPECT_THAT(Error("FROM a\nENV A=\"open\n"),
              StartsWith("Dockerfile line 2: unterminated double quote in \"\"open\""));
  EXPECT_THAT(Error("FROM a\nCOPY 'a /b\n"), StartsWith("Dockerfile line 2: unterminated single quote"));
  EXPECT_THAT(Error("FROM a\nWORKDIR \"/x \\\n  y\n"), StartsWith("Dockerfile line 2: unterminated"));
  EXPECT_THAT(Error("FROM a\nCOPY --chown=\"a b c\n"), StartsWith("Dockerfile line 2: unterminated"));
}

TEST(ParseTest, WholeFileProblems) {
  EXPECT_EQ(Error(""), "Dockerfile: empty");
  EXPECT_EQ(Error("# only a comment\n\n   \n"), "Dockerfile: empty");
  EXPECT_EQ(Error("ARG A=1\n"), "Dockerfile: no FROM");
  EXPECT_EQ(Error("FROM a\n# " + std::string(size_t{1} << 20, 'x')), "Dockerfile: larger than 1 MiB");
}

TEST(ParseTest, AtMostTenThousandSteps) {
  std::string text = "FROM a\n";
  for (int i = 1; i < 10000; ++i) text += "USER u\n";
  EXPECT_EQ(Ok(text).steps.size(), 10000u);
  text += "USER u\n";
  EXPECT_EQ(Error(text), "Dockerfile line 10001: more than 10000 instructions");
}

TEST(ExpandTest, Forms) {
  const std::map<std::string, std::string> vars = {{"A", "a"}, {"EMPTY", ""}, {"B_2", "b"}};
  auto expand = [&](std::string_view w) {
    auto r = Expand(w, vars);
    EXPECT_TRUE(r.ok()) << r.status() << " " << w;
    return r.ok() ? *r : std::string("<error>");
  };
  EXPECT_EQ(expand("plain/text"), "plain/text");
  EXPECT_EQ(expand("$A/${A}/$B_2-x"), "a/a/b-x");
  EXPECT_EQ(expand("[$UNKNOWN${UNKNOWN}]"), "[]");
  EXPECT_EQ(expand("${A:-d} ${EMPTY:-d} ${UNKNOWN:-d}"), "a d d");
  EXPECT_EQ(expand("${A:+alt} [${EMPTY:+alt}] [${UNKNOWN:+alt}]"), "alt [] []");
  EXPECT_EQ(expand("${EMPTY-d}|${UNKNOWN-d}|${EMPTY+s}|${UNKNOWN+s}"), "|d|s|");
  EXPECT_EQ(expand("${UNKNOWN:-${A}-${EMPTY:-z}}"), "a-z");
  EXPECT_EQ(expand("${A:-${NOT CHECKED}}"), "a");  // a default is not looked at when unused
  EXPECT_EQ(expand("\\$A \\${A} C:\\dir"), "$A ${A} C:\\dir");
  EXPECT_EQ(expand("cost $ 5 $"), "cost $ 5 $");
  EXPECT_EQ(expand("${A}}"), "a}");
}

TEST(ExpandTest, BadSyntax) {
  for (std::string_view w : {"${", "x${A", "${}", "${A:}", "${A:x}", "${A?}", "${-x}", "${A:-${B}"}) {
    auto r = Expand(w, {});
    ASSERT_FALSE(r.ok()) << w;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), StartsWith(fmt::format("bad variable substitution in \"{}\"", w)));
  }
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += "${X:-";
  deep += std::string(40, '}');
  EXPECT_THAT(std::string(Expand(deep, {}).status().message()), HasSubstr("nested more than"));
}

TEST(ExpandTest, BoundedOutput) {
  const std::map<std::string, std::string> vars = {{"BIG", std::string(size_t{1} << 19, 'x')}};
  EXPECT_TRUE(Expand("$BIG$BIG", vars).ok());
  EXPECT_THAT(std::string(Expand("$BIG$BIG$BIG", vars).status().message()), HasSubstr("more than 1 MiB"));
}

}  // namespace
}  // namespace sbx::image::dockerfile
