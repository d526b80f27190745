package markdown

import (
	"slices"
	"testing"
)

const sample = "# Title\n" +
	"\n" +
	"## A heading, with `code` and [a link](x.md)\n" +
	"\n" +
	"## Title\n" +
	"\n" +
	"Text with [a link](other.md#part \"its title\") and `a span with [no](link.md)`,\n" +
	"and a span that `runs over\n" +
	"two lines`.\n" +
	"\n" +
	"[ref]: ref.md\n" +
	"<a id=\"custom\"></a>\n" +
	"\n" +
	"```sh\n" +
	"make test\n" +
	"```\n" +
	"\n" +
	"| a | b |\n" +
	"| --- | --- |\n" +
	"| `x` | y \\| z |\n"

func TestParse(t *testing.T) {
	d := Parse("sample.md", sample)
	for _, a := range []string{"title", "a-heading-with-code-and-a-link", "title-1", "custom"} {
		if !d.Anchors[a] {
			t.Errorf("no anchor #%s; have %v", a, d.Anchors)
		}
	}
	var links []string
	for _, l := range d.Links {
		links = append(links, l.Text)
	}
	if want := []string{"x.md", "other.md#part", "ref.md"}; !slices.Equal(links, want) {
		t.Errorf("links = %q, want %q (none inside a code span)", links, want)
	}
	var code []string
	for _, c := range d.Code {
		code = append(code, c.Text)
	}
	if want := []string{"code", "a span with [no](link.md)", "runs over two lines", "make test\n", "x"}; !slices.Equal(code, want) {
		t.Errorf("code = %q, want %q", code, want)
	}
	if d.Code[2].Line != 8 || d.Code[3].Line != 15 {
		t.Errorf("code lines %d and %d, want 8 and 15", d.Code[2].Line, d.Code[3].Line)
	}
	if len(d.Tables) != 1 || len(d.Tables[0]) != 3 || d.Tables[0][2].Line != 20 {
		t.Fatalf("tables = %+v, want one of 3 rows ending on line 20", d.Tables)
	}
	if cells := TableCells(d.Tables[0][2].Text); !slices.Equal(cells, []string{"`x`", "y | z"}) {
		t.Errorf("cells = %q, want an escaped pipe kept in its cell", cells)
	}
}

func TestCodeSpan(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{"`--flag`", "--flag", true},
		{"`a` and `b`", "", false},
		{"plain", "", false},
	} {
		if got, ok := CodeSpan(tc.in); got != tc.want || ok != tc.ok {
			t.Errorf("CodeSpan(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Who may read them":                  "who-may-read-them",
		"The kopf migration (internal/kopf)": "the-kopf-migration-internalkopf",
		"[Linked](x.md) heading":             "linked-heading",
		"snake_case and dash-es":             "snake_case-and-dash-es",
	} {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}
