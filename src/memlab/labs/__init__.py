"""The book's labs: each module defines one lab's exercises with :func:`memlab.labs.grader.define_lab`."""
