package sops

// The SOPS document model, read from and written to YAML as the sops CLI's
// YAML store does (stores/yaml/store.go at getsops/sops v3.13.2): keys stay
// in clear in their order, comments become leaves of the tree (so that they
// are encrypted too), and every scalar is the Go value yaml.v3 decodes it
// to, which is what the MAC hashes. The package keeps its own model
// because the library's (the root sops package, its YAML store) imports
// the key services of every cloud and Vault, which this tool never calls:
// about 23 MB of the binary and 22 MiB of resident memory at start.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// comment is one YAML comment line, without its '#'. inline marks a
// comment that stood beside a value (`key: value # comment`): sops v3.13.2
// writes it back there, where v3.11.0 moved it above the entry
// (store.go appendInlineCommentToMap and addCommentsLine, commit 42f75bedd).
type comment struct {
	text   string
	inline bool
}

// item is one mapping entry; key is a string, or a comment that sits
// between entries (its value then nil).
type item struct {
	key   any
	value any
}

// branch is a YAML mapping in order: a document, or a nested mapping.
type branch []item

// metadataKey is the top-level key that holds a file's SOPS metadata.
const metadataKey = "sops"

// indent is the sops CLI's YAML indent unless .sops.yaml's
// stores.yaml.indent says otherwise (IndentDefault at v3.13.2).
const indent = 4

// commentLines splits a yaml.v3 comment block into its lines without the
// leading '#', dropping empty lines.
func commentLines(block string, inline bool) []comment {
	var out []comment
	for _, line := range strings.Split(block, "\n") {
		if line != "" {
			out = append(out, comment{line[1:], inline})
		}
	}
	return out
}

func appendListComments(list []any, block string) []any {
	return appendListCommentsAs(list, block, false)
}

func appendListCommentsAs(list []any, block string, inline bool) []any {
	for _, c := range commentLines(block, inline) {
		list = append(list, c)
	}
	return list
}

func appendMapComments(b branch, block string) branch {
	return appendMapCommentsAs(b, block, false)
}

func appendMapCommentsAs(b branch, block string, inline bool) branch {
	for _, c := range commentLines(block, inline) {
		b = append(b, item{key: c})
	}
	return b
}

// treeValue turns a YAML node into a tree value. commentsTaken says the
// caller already placed the node's own head and line comments.
func treeValue(n *yaml.Node, commentsTaken bool) (any, error) {
	switch n.Kind {
	case yaml.SequenceNode:
		var list []any
		if !commentsTaken {
			list = appendListComments(list, n.HeadComment)
			list = appendListComments(list, n.LineComment)
		}
		for _, e := range n.Content {
			list = appendListComments(list, e.HeadComment)
			list = appendListCommentsAs(list, e.LineComment, true)
			v, err := treeValue(e, true)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
			list = appendListComments(list, e.FootComment)
		}
		if !commentsTaken {
			list = appendListComments(list, n.FootComment)
		}
		return list, nil
	case yaml.MappingNode:
		return appendMapping(n, branch{}, commentsTaken)
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, err
		}
		return v, nil
	case yaml.AliasNode:
		return treeValue(n.Alias, false)
	}
	return nil, nil
}

// appendMapping adds a mapping (or a document holding one) to b, with its
// comments where the sops CLI puts them: a scalar value's comments before
// its entry, a nested block's inside it.
func appendMapping(n *yaml.Node, b branch, commentsTaken bool) (branch, error) {
	if !commentsTaken {
		b = appendMapComments(b, n.HeadComment)
		b = appendMapComments(b, n.LineComment)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			var err error
			if b, err = appendMapping(c, b, false); err != nil {
				return nil, err
			}
		}
	case yaml.SequenceNode:
		return nil, errors.New("YAML documents that are sequences are not supported")
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			b = appendMapComments(b, k.HeadComment)
			b = appendMapComments(b, k.LineComment)
			scalar := v.Kind == yaml.ScalarNode || v.Kind == yaml.AliasNode
			if scalar {
				b = appendMapComments(b, v.HeadComment)
				b = appendMapCommentsAs(b, v.LineComment, true)
			}
			var key any
			if err := k.Decode(&key); err != nil {
				return nil, err
			}
			value, err := treeValue(v, scalar)
			if err != nil {
				return nil, err
			}
			b = append(b, item{key: key, value: value})
			if scalar {
				b = appendMapComments(b, v.FootComment)
			}
			b = appendMapComments(b, k.FootComment)
		}
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return b, nil
		}
		return nil, errors.New("YAML documents that are values are not supported")
	case yaml.AliasNode:
		var err error
		if b, err = appendMapping(n.Alias, b, false); err != nil {
			return nil, err
		}
	}
	if !commentsTaken {
		b = appendMapComments(b, n.FootComment)
	}
	return b, nil
}

// loadDocuments reads every YAML document of data into a branch.
func loadDocuments(data []byte) ([]branch, error) {
	var docs []branch
	d := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := d.Decode(&n)
		if err == io.EOF {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading YAML: %w", err)
		}
		b, err := appendMapping(&n, branch{}, false)
		if err != nil {
			return nil, fmt.Errorf("reading YAML: %w", err)
		}
		docs = append(docs, b)
	}
}

// loadPlain reads a plaintext YAML file; its first document must be a
// mapping, as the sops CLI requires.
func loadPlain(data []byte) ([]branch, error) {
	if len(data) > 0 {
		if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(make(map[string]any)); err != nil {
			return nil, err
		}
	}
	return loadDocuments(data)
}

// loadEncrypted reads an encrypted YAML file: its metadata (the first
// document's sops mapping) and its documents without it.
func loadEncrypted(data []byte) (metadata, []branch, error) {
	var holder struct {
		Metadata *storedMetadata `yaml:"sops"`
	}
	if err := yaml.Unmarshal(data, &holder); err != nil {
		return metadata{}, nil, fmt.Errorf("reading YAML: %w", err)
	}
	if holder.Metadata == nil {
		return metadata{}, nil, errors.New("sops metadata not found")
	}
	md, err := holder.Metadata.internal()
	if err != nil {
		return metadata{}, nil, err
	}
	docs, err := loadDocuments(data)
	if err != nil {
		return metadata{}, nil, err
	}
	for i, doc := range docs {
		kept := doc[:0:0]
		for _, it := range doc {
			if it.key != metadataKey {
				kept = append(kept, it)
			}
		}
		docs[i] = kept
	}
	return md, docs, nil
}

// emit writes the documents as YAML, each with extra appended at its end
// (the metadata of an encrypted file).
func emit(docs []branch, extra ...item) ([]byte, error) {
	var buf bytes.Buffer
	e := yaml.NewEncoder(&buf)
	e.SetIndent(indent)
	for _, doc := range docs {
		mapping := &yaml.Node{Kind: yaml.MappingNode}
		if err := appendBranchNodes(append(append(branch(nil), doc...), extra...), mapping); err != nil {
			return nil, err
		}
		if err := e.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{mapping}}); err != nil {
			return nil, fmt.Errorf("writing YAML: %w", err)
		}
	}
	if err := e.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// headComment puts comment lines before a node, before what it has
// there; lineComment beside it and footComment after it, after what it has.
func headComment(n *yaml.Node, lines []string) { addComment(&n.HeadComment, lines, true) }

func lineComment(n *yaml.Node, lines []string) { addComment(&n.LineComment, lines, false) }

func footComment(n *yaml.Node, lines []string) { addComment(&n.FootComment, lines, false) }

// addComment adds lines to a node's comment field, before or after what
// it holds.
func addComment(field *string, lines []string, before bool) {
	if len(lines) == 0 {
		return
	}
	c := "#" + strings.Join(lines, "\n#")
	switch {
	case *field == "":
	case before:
		c += "\n" + *field
	default:
		c = *field + "\n" + c
	}
	*field = c
}

func valueNode(v any) (*yaml.Node, error) {
	switch v := v.(type) {
	case branch:
		n := &yaml.Node{Kind: yaml.MappingNode}
		return n, appendBranchNodes(v, n)
	case []any:
		n := &yaml.Node{Kind: yaml.SequenceNode}
		return n, appendListNodes(v, n)
	}
	n := &yaml.Node{}
	return n, n.Encode(v)
}

// appendBranchNodes writes a branch's entries into a mapping node: the
// comments before the first entry head the mapping, the others head the
// entry they precede, an inline comment goes beside the value of the
// entry after it, and trailing ones follow the last entry (inline ones
// last), as appendTreeBranch does at sops v3.13.2.
func appendBranchNodes(b branch, mapping *yaml.Node) error {
	var pending, inline []string
	first := true
	for _, it := range b {
		if c, ok := it.key.(comment); ok {
			if c.inline {
				inline = append(inline, c.text)
			} else {
				pending = append(pending, c.text)
			}
			continue
		}
		if first {
			headComment(mapping, pending)
			pending, first = nil, false
		}
		k := &yaml.Node{}
		if err := k.Encode(it.key); err != nil {
			return err
		}
		headComment(k, pending)
		pending = nil
		v, err := valueNode(it.value)
		if err != nil {
			return err
		}
		lineComment(v, inline)
		inline = nil
		mapping.Content = append(mapping.Content, k, v)
	}
	var last *yaml.Node
	if !first {
		last = mapping.Content[len(mapping.Content)-2]
	}
	trailingComment(mapping, last, append(pending, inline...))
	return nil
}

// trailingComment puts comments that follow a block's last entry after
// that entry (its key node for a mapping), or on the block when it has no
// entry.
func trailingComment(block, last *yaml.Node, lines []string) {
	if last == nil {
		headComment(block, lines)
		return
	}
	footComment(last, lines)
}

func appendListNodes(list []any, seq *yaml.Node) error {
	var pending, inline []string
	first := true
	for _, e := range list {
		if c, ok := e.(comment); ok {
			if c.inline {
				inline = append(inline, c.text)
			} else {
				pending = append(pending, c.text)
			}
			continue
		}
		if first {
			headComment(seq, pending)
			pending, first = nil, false
		}
		n, err := valueNode(e)
		if err != nil {
			return err
		}
		headComment(n, pending)
		lineComment(n, inline)
		pending, inline = nil, nil
		seq.Content = append(seq.Content, n)
	}
	var last *yaml.Node
	if !first {
		last = seq.Content[len(seq.Content)-1]
	}
	trailingComment(seq, last, append(pending, inline...))
	return nil
}
