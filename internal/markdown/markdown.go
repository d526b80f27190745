// Package markdown reads the parts of Markdown (CommonMark, with GitHub's
// pipe tables and heading anchors) that the docs test checks: headings and
// their anchors, link destinations, code spans and fenced code, and table
// rows. It is no renderer: what it does not need, it does not parse.
package markdown

import (
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// Doc is what the docs test needs from one Markdown file.
type Doc struct {
	Path    string
	Anchors map[string]bool
	Links   []Ref // destinations of inline links, images and reference definitions
	Code    []Ref // code spans and fenced code blocks
	Tables  [][]Ref
}

// Ref is a piece of text and the line it starts on.
type Ref struct {
	Text string
	Line int
}

var (
	fenceRE   = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})")
	headingRE = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(\s+#+)?\s*$`)
	// linkDestRE matches the destination of an inline link or image:
	// `](dest)` or `](dest "title")`.
	linkDestRE = regexp.MustCompile(`\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+"[^"]*")?\s*\)`)
	refDefRE   = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(\S+)`)
	htmlIDRE   = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// Parse reads the parts of CommonMark the checks need: ATX
// headings, fenced code, code spans (which may span lines within a
// paragraph), link destinations and pipe tables.
func Parse(path string, src string) Doc {
	doc := Doc{Path: path, Anchors: map[string]bool{}}
	slugCount := map[string]int{}
	lines := strings.Split(src, "\n")
	var fence string // the opening fence while inside a code block
	var code strings.Builder
	codeLine := 0
	var para []string
	paraLine := 0
	var table []Ref
	flushPara := func() {
		if len(para) > 0 {
			doc.scanInline(strings.Join(para, "\n"), paraLine)
			para = nil
		}
		if table != nil {
			doc.Tables = append(doc.Tables, table)
			table = nil
		}
	}
	for i, line := range lines {
		n := i + 1
		if fence != "" {
			if m := fenceRE.FindStringSubmatch(line); m != nil && m[1][0] == fence[0] && len(m[1]) >= len(fence) && strings.TrimSpace(line[len(m[0]):]) == "" {
				doc.Code = append(doc.Code, Ref{code.String(), codeLine})
				code.Reset()
				fence = ""
				continue
			}
			code.WriteString(line + "\n")
			continue
		}
		// A fence may be indented inside a list item; up to 3 spaces
		// more than the item's own indentation is enough here.
		trimmed := strings.TrimLeft(line, " ")
		if m := fenceRE.FindStringSubmatch(trimmed); m != nil {
			flushPara()
			fence, codeLine = m[1], n+1
			continue
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			flushPara()
			slug := Slug(m[2])
			if c := slugCount[slug]; c > 0 {
				doc.Anchors[slug+"-"+strconv.Itoa(c)] = true
			} else {
				doc.Anchors[slug] = true
			}
			slugCount[slug]++
			doc.scanInline(m[2], n)
			continue
		}
		if strings.TrimSpace(line) == "" {
			flushPara()
			continue
		}
		if m := refDefRE.FindStringSubmatch(line); m != nil {
			doc.Links = append(doc.Links, Ref{m[1], n})
		}
		for _, m := range htmlIDRE.FindAllStringSubmatch(line, -1) {
			doc.Anchors[m[1]] = true
		}
		if strings.HasPrefix(strings.TrimSpace(line), "|") {
			table = append(table, Ref{line, n})
		}
		if len(para) == 0 {
			paraLine = n
		}
		para = append(para, line)
	}
	if fence != "" {
		doc.Code = append(doc.Code, Ref{code.String(), codeLine})
	}
	flushPara()
	return doc
}

// scanInline collects the code spans and link destinations of one block
// of text starting at line first. A link inside a code span is not a link.
func (d *Doc) scanInline(text string, first int) {
	var rest strings.Builder
	for i := 0; i < len(text); {
		if text[i] != '`' {
			rest.WriteByte(text[i])
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		end := closingBackticks(text, i+n, n)
		if end < 0 { // no closing run: literal backticks
			rest.WriteString(text[i : i+n])
			i += n
			continue
		}
		span := strings.ReplaceAll(text[i+n:end], "\n", " ")
		d.Code = append(d.Code, Ref{span, first + strings.Count(text[:i], "\n")})
		// Keep the line count of what was removed.
		rest.WriteString(strings.Repeat("\n", strings.Count(text[i:end+n], "\n")))
		i = end + n
	}
	plain := rest.String()
	for _, m := range linkDestRE.FindAllStringSubmatchIndex(plain, -1) {
		dest := strings.Trim(plain[m[2]:m[3]], "<>")
		d.Links = append(d.Links, Ref{dest, first + strings.Count(plain[:m[0]], "\n")})
	}
}

// closingBackticks returns the index of the next run of exactly n
// backticks at or after from, or -1.
func closingBackticks(s string, from, n int) int {
	for i := from; i < len(s); {
		if s[i] != '`' {
			i++
			continue
		}
		j := i
		for j < len(s) && s[j] == '`' {
			j++
		}
		if j-i == n {
			return i
		}
		i = j
	}
	return -1
}

// Slug is the anchor GitHub gives a heading: the rendered text in
// lower case, without punctuation other than '-' and '_', spaces to '-'.
func Slug(heading string) string {
	heading = inlineLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TableCells splits a pipe-table row into its trimmed cells; `\|` is a
// literal pipe.
func TableCells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(row, "|")
	row = strings.TrimSuffix(row, "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(row); i++ {
		switch {
		case row[i] == '\\' && i+1 < len(row) && row[i+1] == '|':
			cur.WriteByte('|')
			i++
		case row[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(row[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// CodeSpan returns the content of s when s is exactly one code span.
func CodeSpan(s string) (string, bool) {
	if len(s) >= 2 && s[0] == '`' && s[len(s)-1] == '`' && !strings.Contains(s[1:len(s)-1], "`") {
		return s[1 : len(s)-1], true
	}
	return "", false
}
