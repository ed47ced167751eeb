"""The book's labs: each module defines one lab's exercises with :func:`memlab.lab.define_lab`."""
