package ctl

import (
	"fmt"
	"io"
	"strings"
)

// Tree is what shell completion knows of a program: its top-level
// commands and, under one of them (the CLI's), the groups, their commands
// and each command's flags. It is made from the one command table.
type Tree struct {
	Prog   string // the program's name, e.g. drover
	Top    []Item // the program's commands
	Under  string // the top-level command the groups are under, e.g. ctl
	Groups []Group
}

// Item is a named thing with a one-line summary.
type Item struct{ Name, Summary string }

// Group is a group of commands (devices, profiles, …).
type Group struct {
	Item
	Commands []Command
}

// Command is one command of a group with its flags.
type Command struct {
	Item
	Flags []Item // names without dashes
}

// Shells completion is written for.
var Shells = []string{"bash", "zsh", "fish"}

// WriteCompletion writes the completion script of shell for t.
func WriteCompletion(w io.Writer, shell string, t Tree) error {
	var s string
	switch shell {
	case "bash":
		s = bashCompletion(t)
	case "zsh":
		s = zshCompletion(t)
	case "fish":
		s = fishCompletion(t)
	default:
		return UsageError{fmt.Errorf("completion is written for bash, zsh or fish, not %q", shell)}
	}
	_, err := io.WriteString(w, s)
	return err
}

func names(items []Item) string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Name
	}
	return strings.Join(out, " ")
}

func groupItems(gs []Group) []Item {
	out := make([]Item, len(gs))
	for i, g := range gs {
		out[i] = g.Item
	}
	return out
}

func commandItems(cs []Command) []Item {
	out := make([]Item, len(cs))
	for i, c := range cs {
		out[i] = c.Item
	}
	return out
}

func dashed(flags []Item) string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i] = "--" + f.Name
	}
	return strings.Join(out, " ")
}

// fn is the completion function's name.
func (t Tree) fn() string { return "_" + strings.ReplaceAll(t.Prog, "-", "_") }

func bashCompletion(t Tree) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# bash completion of %[1]s (%[1]s %[2]s completion bash)\n", t.Prog, t.Under)
	fmt.Fprintf(&b, `%s() {
	local cur=${COMP_WORDS[COMP_CWORD]} i
	local -a pos=()
	for ((i = 1; i < COMP_CWORD; i++)); do
		[[ ${COMP_WORDS[i]} == -* ]] || pos+=("${COMP_WORDS[i]}")
	done
	if ((${#pos[@]} == 0)); then
		COMPREPLY=($(compgen -W %q -- "$cur"))
		return
	fi
	if [[ ${pos[0]} != %s ]]; then
		COMPREPLY=($(compgen -f -- "$cur"))
		return
	fi
	if [[ $cur == -* ]]; then
		case "${pos[1]} ${pos[2]}" in
`, t.fn(), names(t.Top), t.Under)
	for _, g := range t.Groups {
		for _, c := range g.Commands {
			fmt.Fprintf(&b, "\t\t%q) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", g.Name+" "+c.Name, dashed(c.Flags))
		}
	}
	fmt.Fprintf(&b, `		esac
		return
	fi
	case ${#pos[@]} in
	1) COMPREPLY=($(compgen -W %q -- "$cur")) ;;
	2)
		case ${pos[1]} in
`, names(groupItems(t.Groups)))
	for _, g := range t.Groups {
		fmt.Fprintf(&b, "\t\t%s) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", g.Name, names(commandItems(g.Commands)))
	}
	fmt.Fprintf(&b, `		esac
		;;
	*) COMPREPLY=($(compgen -f -- "$cur")) ;;
	esac
}
complete -F %s %s
`, t.fn(), t.Prog)
	return b.String()
}

// zq quotes s for zsh (and fish) in single quotes.
func zq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// described is items as _describe takes them: 'name:summary' ...
func described(items []Item) string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = zq(strings.ReplaceAll(it.Name, ":", `\:`) + ":" + it.Summary)
	}
	return strings.Join(out, " ")
}

func zshCompletion(t Tree) string {
	var b strings.Builder
	f := t.fn()
	fmt.Fprintf(&b, "#compdef %s\n# zsh completion of %[1]s (%[1]s %[2]s completion zsh)\n", t.Prog, t.Under)
	fmt.Fprintf(&b, `%s() {
	local -a pos items
	local w cur=${words[CURRENT]}
	for w in ${words[2,CURRENT-1]}; do
		[[ $w == -* ]] || pos+=("$w")
	done
	if (( ${#pos} == 0 )); then
		items=(%s)
		_describe -t commands '%s command' items
		return
	fi
	if [[ ${pos[1]} != %s ]]; then
		_files
		return
	fi
	if [[ $cur == -* ]]; then
		case "${pos[2]} ${pos[3]}" in
`, f, described(t.Top), t.Prog, t.Under)
	for _, g := range t.Groups {
		for _, c := range g.Commands {
			fmt.Fprintf(&b, "\t\t%s) items=(%s) ;;\n", zq(g.Name+" "+c.Name), dashed(c.Flags))
		}
	}
	fmt.Fprintf(&b, `		esac
		compadd -- $items
		return
	fi
	case ${#pos} in
	1)
		items=(%s)
		_describe -t groups 'group' items
		;;
	2)
		case ${pos[2]} in
`, described(groupItems(t.Groups)))
	for _, g := range t.Groups {
		fmt.Fprintf(&b, "\t\t%s) items=(%s) ;;\n", g.Name, described(commandItems(g.Commands)))
	}
	fmt.Fprintf(&b, `		esac
		_describe -t commands 'command' items
		;;
	*) _files ;;
	esac
}
if [[ $funcstack[1] == %[1]s ]]; then
	%[1]s "$@"
else
	compdef %[1]s %[2]s
fi
`, f, t.Prog)
	return b.String()
}

func fishCompletion(t Tree) string {
	var b strings.Builder
	p := "__" + strings.ReplaceAll(t.Prog, "-", "_")
	fmt.Fprintf(&b, "# fish completion of %[1]s (%[1]s %[2]s completion fish)\n", t.Prog, t.Under)
	fmt.Fprintf(&b, `function %[1]s_pos
	set -l t (commandline -opc)
	for w in $t[2..-1]
		string match -q -- '-*' $w; or echo $w
	end
end
# %[1]s_at WORDS: the words before the cursor (flags left out) are WORDS.
function %[1]s_at
	set -l p (%[1]s_pos)
	test (count $p) -eq (count $argv); or return 1
	for i in (seq (count $argv))
		test "$p[$i]" = "$argv[$i]"; or return 1
	end
end
# %[1]s_in WORDS: the words before the cursor start with WORDS.
function %[1]s_in
	set -l p (%[1]s_pos)
	test (count $p) -ge (count $argv); or return 1
	for i in (seq (count $argv))
		test "$p[$i]" = "$argv[$i]"; or return 1
	end
end
complete -c %[2]s -f
`, p, t.Prog)
	for _, it := range t.Top {
		fmt.Fprintf(&b, "complete -c %s -n '%s_at' -a %s -d %s\n", t.Prog, p, zq(it.Name), zq(it.Summary))
	}
	for _, g := range t.Groups {
		fmt.Fprintf(&b, "complete -c %s -n '%s_at %s' -a %s -d %s\n", t.Prog, p, t.Under, zq(g.Name), zq(g.Summary))
		for _, c := range g.Commands {
			if c.Name != "" { // a group that is one command
				fmt.Fprintf(&b, "complete -c %s -n '%s_at %s %s' -a %s -d %s\n", t.Prog, p, t.Under, g.Name, zq(c.Name), zq(c.Summary))
			}
			for _, fl := range c.Flags {
				words := strings.TrimSpace(t.Under + " " + g.Name + " " + c.Name)
				fmt.Fprintf(&b, "complete -c %s -n '%s_in %s' -l %s -d %s\n", t.Prog, p, words, fl.Name, zq(fl.Summary))
			}
		}
	}
	return b.String()
}
